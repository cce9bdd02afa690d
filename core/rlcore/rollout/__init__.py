"""Generation in core: the reference Hugging Face rollout and what every rollout path shares.

- :mod:`rlcore.rollout.hf`: :class:`HFRollout`, the reference engine on ``transformers`` ``generate``
  (registered as ``hf``; its config section is :class:`rlcore.rollout.config.HFRolloutConfig`).
- :mod:`rlcore.rollout.batching`: :func:`completions_to_batch`, completions to the standard batch layout.
- :mod:`rlcore.rollout.sync_check`: :func:`compare_log_probs` and :class:`WeightSyncMismatch`, the
  post-weight-sync agreement check between trainer and rollout.

This package imports nothing heavy; import the submodules.
"""
