"""Built-in rollout (default plugin): the reference Hugging Face ``generate`` engine as ``hf``."""

from rlcore import hookimpl
from rlcore.rollout.config import HFRolloutConfig


@hookimpl
def register_rollout_engines(register):
    register("hf", "rlcore.rollout.hf:HFRollout", config=HFRolloutConfig)
