"""Probe (issue 14): does passing explicit request ids slow the SGLang plugin's batch-256 runs?

Raw ``async_generate`` without ``rid``, the plugin's ``generate`` (with ``rid``), and the plugin's path with
the ``rid`` left out, interleaved on one engine, radix cache flushed before each run.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402
from rlcore.api import SamplingParams  # noqa: E402
from rlcore.api.requests import request_seeds  # noqa: E402
from rlcore.devices import get_platform  # noqa: E402
from sglang_gpu import flush_radix_cache, make_engine, run_plugin, run_raw  # noqa: E402
from vllm_gpu import random_prompts, save_model  # noqa: E402


def run_norid(engine, prompts, params) -> float:
    from rlcore_sglang.sampling import to_completion, to_sglang

    sampling = [to_sglang(params, request_seeds(params, i)[0]) for i in range(len(prompts))]

    async def go():
        out = await engine._loop.engine.async_generate(
            input_ids=prompts, sampling_params=sampling, return_logprob=True
        )
        return [to_completion(p, o, want_log_probs=True) for p, o in zip(prompts, out, strict=True)]

    start = time.perf_counter()
    done = engine._loop.submit(go).result()
    return sum(len(c.token_ids) for c in done) / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/rlcore-bench-gpu"))
    args = parser.parse_args()
    args.attention_backend, args.deterministic, args.bucket_mib = "triton", True, 512
    path = args.workdir / "qwen2-0.5B"
    path.mkdir(parents=True, exist_ok=True)
    if not (path / "config.json").exists():
        save_model(path, "0.5B", torch.device("cuda"))
    engine = make_engine(path, args, get_platform("cuda"), cuda_graph=True)
    funcs = {"raw": run_raw, "plugin": run_plugin, "plugin-no-rid": run_norid}
    runs = {k: [] for k in funcs}
    for f in funcs.values():  # warm-up
        f(engine, random_prompts(args.batch, 0), SamplingParams(max_tokens=256, seed=0))
    for r in range(args.repeats):
        order = list(funcs)[r % 3 :] + list(funcs)[: r % 3]
        for name in order:
            flush_radix_cache(engine)
            params = SamplingParams(temperature=1.0, max_tokens=256, seed=1 + r)
            runs[name].append(funcs[name](engine, random_prompts(args.batch, 1 + r), params))
            print(f"repeat {r} {name}: {runs[name][-1]:.0f} tok/s", flush=True)
    for name, v in runs.items():
        print(f"{name}: median {statistics.median(v):.0f} (runs {', '.join(f'{x:.0f}' for x in v)})")
    engine.shutdown()


if __name__ == "__main__":
    main()
