"""rlcore-test-future: a plugin built for plugin API 99 (a test fixture)."""
