#!/usr/bin/env bash
# The offline Python bundle for running rlcore-vllm on the lent GPU machine (Python 3.12, torch 2.11.0+cu130
# preinstalled, no package registry there): the vllm profile of ../shared/gpu/make-bundle.sh (2026-11-25), kept
# here so the vLLM rows of docs/benchmarks.md can be reproduced from this repository alone.
#
#   bash benchmarks/gpu/vllm_bundle.sh     # Ray, omegaconf, cattrs, megatron-core 0.19.2 + vLLM 0.25.0
#
# It writes .gpu-vllm/c1 .. cN (each <= 48 MiB) and .gpu-vllm/tools (zstd), beside the SGLang bundle's .gpu/,
# and adds /.gpu-vllm/ to .git/info/exclude. How to ship and unpack: README.md beside this script.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
grep -qx '/.gpu-vllm/' "$root/.git/info/exclude" 2>/dev/null || { mkdir -p "$root/.git/info"; echo '/.gpu-vllm/' >> "$root/.git/info/exclude"; }
rm -rf "$root/.gpu-vllm"; mkdir -p "$root/.gpu-vllm/tools" "$work/dl" "$work/site"
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 --platform manylinux1_x86_64 -d "$work/dl" "$@" 2>&1 | grep -v WARNING || true; }
# base: what the GPU image lacks for an rlcore run (it has torch, transformers, pluggy, attrs, pyarrow, pyyaml, numpy)
dl ray==2.60.0 omegaconf==2.4.0 cattrs jsonschema jsonschema-specifications referencing rpds-py megatron-core==0.19.2
dl vllm==0.25.0 blake3 cachetools pydantic==2.14.3 pydantic-core==2.50.4 annotated-types typing-inspection "openai<3" distro jiter sniffio \
     "fastapi<0.137,>=0.133" starlette msgspec pyzmq cbor2 partial-json-parser lark==1.2.2 compressed-tensors==0.17.0 \
     depyf==0.20.0 astor dill gguf setproctitle pybase64 ijson python-json-logger watchfiles diskcache==5.6.3 \
     prometheus-fastapi-instrumentator "mistral_common>=1.11.5" pycountry pydantic-extra-types outlines_core==0.2.14 \
     lm-format-enforcer==0.11.3 interegular openai-harmony
# Unpack keeping each file's mode (zipfile's extractall drops exec bits: Ray's raylet/gcs_server need them).
unpack='import os,sys,zipfile
z=zipfile.ZipFile(sys.argv[1])
for i in z.infolist():
    p=z.extract(i,sys.argv[2]); m=(i.external_attr>>16)&0o777
    if m: os.chmod(p,m)'
for w in "$work"/dl/*.whl; do python3 -c "$unpack" "$w" "$work/site"; done
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
tar -C "$work/site" -cf - . | zstd -T2 -12 -q -o "$work/site.tar.zst"
(cd "$work" && split -b 48M -d -a 1 site.tar.zst part.)
i=1; for p in "$work"/part.*; do mkdir -p "$root/.gpu-vllm/c$i"; mv "$p" "$root/.gpu-vllm/c$i/"; i=$((i+1)); done
cp /usr/bin/zstd "$root/.gpu-vllm/tools/"
for l in $(ldd /usr/bin/zstd | awk '/=>/{print $3}' | grep -v libc.so); do cp -L "$l" "$root/.gpu-vllm/tools/"; done
rm -rf "$work"
echo "vllm bundle: $(ls -d "$root"/.gpu-vllm/c* | wc -l) chunk(s) in .gpu-vllm/; ship them as benchmarks/gpu/README.md says"
