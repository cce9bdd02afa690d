#!/usr/bin/env bash
# The offline Python bundle for running rlcore-sglang on the lent GPU machine (Python 3.12, torch
# 2.11.0+cu130 preinstalled, no package registry there), cut into chunks small enough to travel with
# `device` calls. A copy of the sglang profile of ../shared/gpu/make-bundle.sh (2026-11-24), kept here so
# the GPU rows of docs/benchmarks.md can be reproduced from this repository alone.
#
#   bash benchmarks/gpu/sglang_bundle.sh     # Ray, omegaconf, cattrs, megatron-core 0.19.2 + SGLang 0.5.16
#
# Run it from the root of your checkout. It writes .gpu/c1 .. .gpu/cN (each <= 48 MiB), .gpu/tools (zstd for
# the device, which has none) and .gpu/extra (pytest), and adds /.gpu/ to .git/info/exclude. How to ship
# and unpack: README.md beside this script.
# shellcheck source=benchmarks/gpu/bundle_lib.sh
source "$(dirname "$0")/bundle_lib.sh"
bundle_start .gpu
# What `sglang.Engine` (triton attention, pytorch sampling, memory saver) imported on the H100, 2026-11-24.
# sglang pins transformers 5.12.1 (5.17 on the GPU machine clashes) and that needs tokenizers <= 0.23.0.
dl sglang==0.5.16 sglang-kernel==0.4.5 torch_memory_saver flashinfer_python==0.6.14 transformers==5.12.1 tokenizers==0.22.2 \
     orjson pybase64 uvloop pyzmq msgspec setproctitle xgrammar==0.2.1 apache-tvm-ffi==0.1.11 compressed-tensors gguf \
     partial-json-parser einops fastapi starlette uvicorn annotated-doc pydantic==2.14.4 pydantic-core==2.50.5 annotated-types \
     typing-inspection openai==2.6.1 jiter distro opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions \
     importlib-metadata zipp aiohttp aiohappyeyeballs aiosignal frozenlist multidict propcache yarl ipython traitlets decorator \
     jedi parso matplotlib-inline pexpect prompt-toolkit stack-data asttokens executing pure-eval wcwidth ptyprocess \
     ipython-pygments-lexers loguru dill cuda-python cuda-bindings cuda-pathfinder nvidia-ml-py python-multipart llguidance \
     interegular blobfile sniffio anyio httpx httpcore h11 idna certifi prometheus-client python-dotenv httptools watchfiles \
     websockets pycryptodomex lxml
# pytest for the GPU tests (the machine has none), installed with pip from these wheels there.
mkdir -p "$out/extra"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$out/extra" pytest iniconfig 2>&1 | grep -v WARNING || true
bundle_unpack
# FA3 (flash_ops, 1.1 GB), Blackwell, InfLLM and FlashMLA kernels: not loaded with attention_backend=triton on an H100.
rm -rf "$work/site/sgl_kernel/flash_ops.abi3.so" "$work/site/sgl_kernel/sm100" "$work/site/sgl_kernel/"infllm_ops*.so \
       "$work/site/sgl_kernel/flashmla_ops.abi3.so"
bundle_finish sglang
