"""The ``echo`` engine: rlcore's fake train engine under another name, as a third party would ship it."""

from rlcore.testing.fakes import FakeTrainEngine


class EchoEngine(FakeTrainEngine):
    """A :class:`~rlcore.testing.fakes.FakeTrainEngine` published by a separate distribution."""
