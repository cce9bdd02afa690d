"""Entry point declaring a range of plugin API versions this rlcore does not provide (a newer one)."""

from rlcore import hookimpl

RLCORE_PLUGIN_API = ">=2.0,<3"


@hookimpl
def register_train_engines(register):
    register("future", "rlcore_test_future.engine:FutureEngine")
