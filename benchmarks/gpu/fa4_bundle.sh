#!/usr/bin/env bash
# The offline extra bundle for flash-attn-4 (FlashAttention 4, CuTe DSL kernels, `flash_attn.cute`) on the
# lent GPU machine: benchmarks/attention_gpu.py compares its var-len kernel with PyTorch's, the one both train
# engines use (rlcore.kernels.varlen_attention).
#
#   bash benchmarks/gpu/fa4_bundle.sh      # -> .gpu-fa4/c1 .. cN (<= 48 MiB each) and .gpu-fa4/tools (zstd)
#
# Unpacked into its own folder (/tmp/fa4site) beside the vLLM bundle; the CUDA 13 flavour of the DSL only
# (the machine's torch is cu130; nvidia-cutlass-dsl's unconditional cu12 libraries are left out), and the
# DSL's own path (nvidia_cutlass_dsl/dsl_packages, a .pth in a normal install) goes on PYTHONPATH.
# shellcheck source=benchmarks/gpu/bundle_lib.sh
source "$(dirname "$0")/bundle_lib.sh"
bundle_start_bare .gpu-fa4
dl flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 cuda-bindings==13.5.0 \
  cuda-pathfinder==1.9.1 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5 einops
bundle_unpack
bundle_finish fa4
