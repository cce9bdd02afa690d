"""Registers the fake engines under ``fake`` (default plugin)."""
