"""Entry point: registers the ``echo`` train engine, lazily (importing this module stays cheap)."""

from rlcore import hookimpl
from rlcore.testing.fake_config import FakeTrainConfig

RLCORE_PLUGIN_API = ">=1.0,<2"  # the rlcore plugin API versions this plugin works with


@hookimpl
def register_train_engines(register):
    register("echo", "rlcore_test_echo.engine:EchoEngine", config=FakeTrainConfig)
