"""Test support for rlcore and its plugins: fake engines that really compute, and a contract suite."""

import sys

# A failed ``assert`` shows its values only in modules pytest rewrote as they were imported. pytest
# rewrites an installed plugin's own modules only when the install lists their files: a wheel does, an
# editable install (how a plugin author works) does not, and then a broken engine got a bare
# AssertionError from the contract suite. This package's __init__ runs before any of its modules can be
# imported, whichever comes first (rlcore's pytest11 entry point, a conftest, a test module), so the
# registration is always in time. Only under pytest: rlcore.testing.plugin is loaded by every rlcore run,
# where pytest may not be installed and must not be imported.
if "pytest" in sys.modules:
    sys.modules["pytest"].register_assert_rewrite("rlcore.testing.contract", "rlcore.testing.rollout_values")
