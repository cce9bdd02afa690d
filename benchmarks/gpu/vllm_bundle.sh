#!/usr/bin/env bash
# The offline Python bundle for running rlcore-vllm on the lent GPU machine (Python 3.12, torch 2.11.0+cu130
# preinstalled, no package registry there): the vllm profile of ../shared/gpu/make-bundle.sh (2026-11-25), kept
# here so the vLLM rows of docs/benchmarks.md can be reproduced from this repository alone.
#
#   bash benchmarks/gpu/vllm_bundle.sh     # Ray, omegaconf, cattrs, megatron-core 0.19.2 + vLLM 0.25.0
#
# It writes .gpu-vllm/c1 .. cN (each <= 48 MiB) and .gpu-vllm/tools (zstd), beside the SGLang bundle's .gpu/,
# and adds /.gpu-vllm/ to .git/info/exclude. How to ship and unpack: README.md beside this script.
# shellcheck source=benchmarks/gpu/bundle_lib.sh
source "$(dirname "$0")/bundle_lib.sh"
bundle_start .gpu-vllm
dl vllm==0.25.0 blake3 cachetools pydantic==2.14.3 pydantic-core==2.50.4 annotated-types typing-inspection "openai<3" distro jiter sniffio \
     "fastapi<0.137,>=0.133" starlette msgspec pyzmq cbor2 partial-json-parser lark==1.2.2 compressed-tensors==0.17.0 \
     depyf==0.20.0 astor dill gguf setproctitle pybase64 ijson python-json-logger watchfiles diskcache==5.6.3 \
     prometheus-fastapi-instrumentator "mistral_common>=1.11.5" pycountry pydantic-extra-types outlines_core==0.2.14 \
     lm-format-enforcer==0.11.3 interegular openai-harmony
bundle_unpack
# Hopper uses the FA3 kernels; drop the FA2 build, the Rust router and kernel sources nobody compiles here.
rm -rf "$work/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$work/site/vllm/vllm-rs" \
       "$work/site/vllm/third_party/fmha_sm100" "$work/site/vllm/third_party/deep_gemm/include"
# Structured-output libraries whose pinned versions cannot be met offline: import-time stand-ins.
# Guided decoding is therefore unavailable in this bundle; plain sampling is unaffected.
for m in xgrammar llguidance; do
  mkdir -p "$work/site/$m"
  printf '# stand-in: structured output is unavailable in the offline GPU bundle\ndef __getattr__(name):\n    return type(name, (), {})\n' > "$work/site/$m/__init__.py"
done
touch "$work/site/llguidance/hf.py" "$work/site/llguidance/torch.py"
bundle_finish vllm
