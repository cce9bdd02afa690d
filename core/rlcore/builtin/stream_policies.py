"""Built-in stream policies (default plugin): ``fifo`` and ``finish_order`` (:mod:`rlcore.stream.policies`)."""

from rlcore import hookimpl


@hookimpl
def register_stream_policies(register):
    register("fifo", "rlcore.stream.policies:Fifo")
    register("finish_order", "rlcore.stream.policies:FinishOrder")
