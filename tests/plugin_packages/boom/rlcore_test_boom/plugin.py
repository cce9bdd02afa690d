"""Entry point that raises on import, as a plugin with a missing native library would."""

from rlcore import hookimpl

RLCORE_PLUGIN_API = ">=1.0,<2"  # the rlcore plugin API versions this plugin works with

raise RuntimeError("rlcore-test-boom is broken on purpose: libboom.so not found")


@hookimpl
def register_train_engines(register):  # never reached: the import above fails first
    register("boom", "rlcore_test_boom.engine:BoomEngine")
