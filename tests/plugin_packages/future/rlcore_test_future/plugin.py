"""Entry point declaring a plugin API this rlcore does not provide."""

from rlcore import hookimpl

RLCORE_PLUGIN_API = 99


@hookimpl
def register_train_engines(register):
    register("future", "rlcore_test_future.engine:FutureEngine")
