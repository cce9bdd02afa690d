"""The ``rlcore`` command line."""
