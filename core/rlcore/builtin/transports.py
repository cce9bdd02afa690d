"""Built-in transports (default plugin)."""
