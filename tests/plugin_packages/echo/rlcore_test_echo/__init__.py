"""rlcore-test-echo: the smallest well-formed engine plugin (a test fixture)."""
