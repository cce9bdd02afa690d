"""What a run reports: metric helpers (:mod:`.metrics`), metric sinks (:mod:`.loggers`: console, JSONL,
TensorBoard; :mod:`.trackers`: W&B, MLflow), the run's curves as a PNG (:mod:`.plotting`) and what reaches
the terminal (:mod:`.terminal`).

Leaf modules: they import nothing of rlcore but :mod:`rlcore.api`, so the cluster, the flows and the
trainer can all report through them.
"""
