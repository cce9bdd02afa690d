"""The training run: the step loop (:mod:`.loop`), the run around it (:mod:`.run`: run folder, Ray,
failure reports), what the config builds (:mod:`.build`), checks before anything starts
(:mod:`.preflight`), checkpoints (:mod:`.checkpoint`), the SFT warm-up (:mod:`.sft`) and HF export
(:mod:`.export`).

The top of the house: it drives :mod:`rlcore.flows` (an algorithm's step) over :mod:`rlcore.cluster`
(the roles' workers) and reports through :mod:`rlcore.telemetry`. Nothing below imports it; only the
CLI does. Importing this package imports none of its modules.
"""
