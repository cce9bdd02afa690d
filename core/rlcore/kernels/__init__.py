"""Numerical kernels the train engines share (``rlcore_fsdp``, ``rlcore_megatron``; a third-party engine
may use them too): log-probs and entropy chunk by chunk from hidden states (:mod:`.logits`), causal
attention over packed var-len sequences (:mod:`.varlen_attention`), and token-budgeted micro-batches
(:mod:`.micro_batches`).

Pure tensor code over torch: they import nothing of rlcore, and no engine, device or Ray. Each module is
tested against a float64 or plain-loop reference (``core/tests/kernels``, the engines' suites).
"""
