"""Built-in rewards (default plugin)."""
