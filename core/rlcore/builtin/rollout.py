"""Built-in rollout (default plugin)."""
