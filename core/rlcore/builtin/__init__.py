"""Built-in components, each module a default plugin registered through the public hooks."""
