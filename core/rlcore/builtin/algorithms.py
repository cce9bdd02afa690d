"""Built-in algorithms (default plugin)."""
