# Shared steps of the offline bundles for the lent GPU machine (sourced by sglang_bundle.sh and
# vllm_bundle.sh): download wheels for its Python 3.12, unpack them into one site folder, compress and
# cut it into chunks that fit a `device` call, and carry zstd (the machine has none).
#
#   bundle_start DIR     # DIR (".gpu", ".gpu-vllm") under the checkout: emptied, git-ignored; the base
#                        # packages (Ray, omegaconf, cattrs, megatron-core) downloaded
#   bundle_start_bare DIR  # the same without the base packages (an extra bundle unpacked beside another)
#   dl PKG ...           # more wheels (no dependencies: list them)
#   bundle_unpack        # every downloaded wheel into $work/site
#   bundle_finish NAME   # $work/site -> DIR/c1 .. cN (<= 48 MiB each) and DIR/tools
set -euo pipefail
root=$(git rev-parse --show-toplevel)

bundle_start() {
  out="$root/$1"
  work=$(mktemp -d)
  grep -qx "/$1/" "$root/.git/info/exclude" 2>/dev/null || { mkdir -p "$root/.git/info"; echo "/$1/" >> "$root/.git/info/exclude"; }
  rm -rf "$out"; mkdir -p "$out/tools" "$work/dl" "$work/site"
  # base: what the GPU image lacks for an rlcore run (it has torch, transformers, pluggy, attrs, pyarrow, pyyaml, numpy)
  dl ray==2.60.0 omegaconf==2.4.0 cattrs jsonschema jsonschema-specifications referencing rpds-py megatron-core==0.19.2
}

bundle_start_bare() {
  out="$root/$1"
  work=$(mktemp -d)
  grep -qx "/$1/" "$root/.git/info/exclude" 2>/dev/null || { mkdir -p "$root/.git/info"; echo "/$1/" >> "$root/.git/info/exclude"; }
  rm -rf "$out"; mkdir -p "$out/tools" "$work/dl" "$work/site"
}

dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 --platform manylinux1_x86_64 -d "$work/dl" "$@" 2>&1 | grep -v WARNING || true; }

bundle_unpack() {
  # Unpack keeping each file's mode (zipfile's extractall drops exec bits: Ray's raylet/gcs_server need them).
  local unpack='import os,sys,zipfile
z=zipfile.ZipFile(sys.argv[1])
for i in z.infolist():
    p=z.extract(i,sys.argv[2]); m=(i.external_attr>>16)&0o777
    if m: os.chmod(p,m)'
  for w in "$work"/dl/*.whl; do python3 -c "$unpack" "$w" "$work/site"; done
}

bundle_finish() {
  tar -C "$work/site" -cf - . | zstd -T2 -12 -q -o "$work/site.tar.zst"
  (cd "$work" && split -b 48M -d -a 1 site.tar.zst part.)
  local i=1 p l
  for p in "$work"/part.*; do mkdir -p "$out/c$i"; mv "$p" "$out/c$i/"; i=$((i+1)); done
  cp /usr/bin/zstd "$out/tools/"
  for l in $(ldd /usr/bin/zstd | awk '/=>/{print $3}' | grep -v libc.so); do cp -L "$l" "$out/tools/"; done
  rm -rf "$work"
  echo "$1 bundle: $(ls -d "$out"/c* | wc -l) chunk(s) in ${out#"$root"/}/; ship them as benchmarks/gpu/README.md says"
}
