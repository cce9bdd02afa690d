"""Test-only: ``rlcore train --engine megatron`` on a CPU machine, for the end-to-end test.

The Megatron engine refuses a CPU device unless the test redirect of ``mcore_cpu_redirect.py`` runs in
its process (megatron-core calls ``torch.cuda`` unconditionally). An ``rlcore train`` run starts that
process itself, as a Ray worker, so the test puts this folder on ``PYTHONPATH`` with
``RLCORE_TEST_MEGATRON_ON_CPU=1``: every Python process started so (the driver, the Ray workers, which
inherit both) installs the redirect right after it imports ``rlcore_megatron.engine``, and not at all
if it never does (the rollout worker, Ray's own processes). Never used outside the tests.
"""

import os
import sys

if os.environ.get("RLCORE_TEST_MEGATRON_ON_CPU") == "1":
    import importlib.abc
    import importlib.util

    _TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _ENGINE = "rlcore_megatron.engine"

    class _RedirectAfterEngineImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != _ENGINE:
                return None
            sys.meta_path.remove(self)  # find the real module below, once
            spec = importlib.util.find_spec(name)
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                sys.path.insert(0, _TESTS)
                import mcore_cpu_redirect

                mcore_cpu_redirect.install()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _RedirectAfterEngineImport())
