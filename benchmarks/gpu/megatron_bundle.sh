#!/usr/bin/env bash
# The small offline bundle for the Megatron rows (issue #17) on the lent GPU machine: megatron-core 0.19.2
# and what rlcore's core imports that the GPU image lacks (it has torch, transformers, pluggy, attrs,
# pyarrow, pyyaml, numpy, rich). One chunk, so a fresh machine (the 2-GPU kinds too) is ready after one
# call instead of the four or five of the SGLang and vLLM bundles, which carry megatron-core as well.
#
#   bash benchmarks/gpu/megatron_bundle.sh      # -> .gpu-mcore/c1 and .gpu-mcore/tools (zstd)
#   then megatron_h100.sh's `unpack setup` stages (its header shows the call)
# shellcheck source=benchmarks/gpu/bundle_lib.sh
source "$(dirname "$0")/bundle_lib.sh"
bundle_start_bare .gpu-mcore
dl megatron-core==0.19.2 omegaconf==2.4.0 cattrs
bundle_unpack
bundle_finish mcore
