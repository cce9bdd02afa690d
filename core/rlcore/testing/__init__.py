"""Test support for rlcore and its plugins: fake engines that really compute, and a contract suite."""
