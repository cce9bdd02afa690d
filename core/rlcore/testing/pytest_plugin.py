"""pytest plugin of rlcore: contract-suite fixtures for engine plugins (see rlcore.testing.contract)."""
