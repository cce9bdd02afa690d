"""Where vLLM's batch-256 generation time goes (issue 35's ``rollout-vllm-vs-sglang-b256``).

SGLang's plugin generated 2.4x vLLM's tokens per second at batch 256 on the same card (docs/benchmarks.md,
"vLLM and SGLang in one call"). The two engines differ in where their host work runs: SGLang schedules in
a process of its own, overlapped with the GPU, and detokenizes in a third process; the rlcore vLLM plugin
runs vLLM's engine core in the calling process (``vllm.in_process: true``), so scheduling, output
processing (log-prob objects, incremental detokenization) and the GPU's launches share one thread. A small
model at a large batch is bound by that host work. This script separates the parts.

One engine per process, built the way the plugin builds it (``--engine-process``: ``in`` for the plugin's
default, ``own`` for vLLM's engine core in a process of its own, vLLM's own default). The systems run
interleaved, the order rotating every repeat, each on fresh prompts with an empty prefix cache:

- ``plugin``: ``VLLMRollout.generate`` (rlcore's engine loop, log-probs, detokenized text);
- ``raw``: ``LLM.generate`` with the plugin's requests (``to_vllm``: log-prob of the sampled token,
  detokenized);
- ``raw-no-logprobs``, ``raw-no-detok``: the same without one of the two;
- ``raw-bare``: without either (what the engine costs with nothing asked beyond token ids);
- ``raw-flat``, ``raw-flat-no-detok`` (``--systems``): log-probs in vLLM's flat lists, with the engine
  detokenizing and without (then the texts decoded in one batch, timed), what the plugin asks since.

The JSON keeps per system the median and range of tokens per second and the engine's resolved settings
(async scheduling, CUDA-graph sizes, attention backend, where its core runs).

    python benchmarks/vllm_gap_gpu.py --engine-process in --out gap_in.json [--batch 256] [--repeats 3]
    python benchmarks/vllm_gap_gpu.py --device cpu --shape smoke --kv-cache-gib 1 --out /tmp/gap.json  # dry run
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from rlcore.devices import get_platform
from vllm_gpu import (  # benchmarks/ leads sys.path
    PROMPT_LEN,
    SHAPES,
    interleaved,
    make_engine,
    run_plugin,
    save_model,
    spread,
)

SYSTEMS = ("plugin", "raw", "raw-no-logprobs", "raw-no-detok", "raw-bare")
#: The plugin's requests since the fix, raw: log-probs flat (``flat_logprobs``), with and without the
#: engine detokenizing (without: the texts decoded in one batch afterwards, inside the timing).
FLAT = ("raw-flat", "raw-flat-no-detok")


def engine_settings(engine) -> dict:
    """What vLLM resolved for this engine: the settings that decide its host overhead."""
    with engine.exclusive() as llm:
        config = llm.llm_engine.vllm_config
    compilation = config.compilation_config
    return {
        "async_scheduling": config.scheduler_config.async_scheduling,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "cudagraph_mode": str(getattr(compilation, "cudagraph_mode", None)),
        "max_cudagraph_capture_size": getattr(compilation, "max_cudagraph_capture_size", None),
        "attention_backend": str(getattr(getattr(config, "attention_config", None), "backend", None)),
        "executor_backend": str(config.parallel_config.distributed_executor_backend),
        "enforce_eager": config.model_config.enforce_eager,
    }


def _raw(logprobs: bool, detokenize: bool, flat: bool = False):
    def run(engine, prompts, params) -> float:
        from rlcore_vllm.sampling import to_vllm

        with engine.exclusive() as llm:
            requests = []
            for _ in prompts:
                vllm_params = to_vllm(params, None)
                if not logprobs:
                    vllm_params.logprobs = None
                vllm_params.detokenize = detokenize
                vllm_params.flat_logprobs = flat and logprobs
                requests.append(vllm_params)
            start = time.perf_counter()
            out = llm.generate([{"prompt_token_ids": p} for p in prompts], requests, use_tqdm=False)
            if flat and not detokenize:  # the texts, as the plugin decodes them
                llm.get_tokenizer().batch_decode(
                    [o.outputs[0].token_ids for o in out], skip_special_tokens=True
                )
            seconds = time.perf_counter() - start
        return sum(len(o.outputs[0].token_ids) for o in out) / seconds

    return run


RUNS = {
    "plugin": run_plugin,
    "raw": _raw(logprobs=True, detokenize=True),
    "raw-no-logprobs": _raw(logprobs=False, detokenize=True),
    "raw-no-detok": _raw(logprobs=True, detokenize=False),
    "raw-bare": _raw(logprobs=False, detokenize=False),
    "raw-flat": _raw(logprobs=True, detokenize=True, flat=True),
    "raw-flat-no-detok": _raw(logprobs=True, detokenize=False, flat=True),
}


def measure(engine, batch: int, repeats: int, new_tokens: int, systems: list[str]) -> dict:
    runs = interleaved(
        engine, {name: RUNS[name] for name in systems}, batch, repeats, new_tokens, report=True
    )
    return {name: {**spread(v), "runs": v} for name, v in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-process", choices=("in", "own"), default="in")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS + FLAT)
    parser.add_argument("--shape", default="0.5B", choices=list(SHAPES))
    parser.add_argument("--device", default="cuda", help="rlcore device platform (cpu for a dry run)")
    parser.add_argument("--kv-cache-gib", type=float, help="fixed KV cache size (needed on cpu)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rlcore-bench-gpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import vllm

    platform = get_platform(args.device)
    device = torch.device(platform.device_type)
    name = torch.cuda.get_device_name() if device.type == "cuda" else device.type
    path = args.workdir / f"qwen2-{args.shape}"
    path.mkdir(parents=True, exist_ok=True)
    save_model(path, args.shape, device)
    platform.empty_cache()
    started = time.perf_counter()
    eager = device.type == "cpu"
    engine = make_engine(path, eager, platform, args.kv_cache_gib, in_process=args.engine_process == "in")
    result = {
        "hardware": f"{name}, vllm {vllm.__version__}, torch {torch.__version__}",
        "command": f"python benchmarks/vllm_gap_gpu.py --engine-process {args.engine_process} --batch "
        f"{args.batch} --new-tokens {args.new_tokens} --repeats {args.repeats} --shape {args.shape}",
        "workload": f"Qwen2.5-{args.shape} shape, batch {args.batch}, {PROMPT_LEN}+{args.new_tokens} tokens, "
        "temperature 1",
        "engine_process": args.engine_process,
        "engine_start_s": time.perf_counter() - started,
    }
    try:
        result["settings"] = engine_settings(engine)
        print(json.dumps(result["settings"]), flush=True)
        result["tokens_per_s"] = measure(engine, args.batch, args.repeats, args.new_tokens, args.systems)
    finally:
        args.out.write_text(json.dumps(result, indent=2))
        engine.shutdown()
    for system, value in result["tokens_per_s"].items():
        print(
            f"| vllm ({args.engine_process}) {system} | {value['median']:.0f} ({value['min']:.0f}-{value['max']:.0f}) |"
        )


if __name__ == "__main__":
    main()
