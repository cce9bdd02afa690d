"""rlcore-ascend: the ``ascend`` device platform (torch_npu, HCCL) and the ``hccl`` weight transport."""
