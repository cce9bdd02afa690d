"""The ``rule`` reward provider: verl-style scoring functions run in a pool of worker processes.

Each sample is scored by the function registered for its ``data_source`` (or by the user function of
``reward.custom_function_path``, for all samples). A sample whose scorer raises, returns a non-number or
runs past ``reward.timeout_s`` fails the step with a :class:`RewardError` naming it, or with
``reward.on_error=zero`` scores 0 and is counted in the ``reward/errors`` metric.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import multiprocessing
import os
import threading
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from rlcore.api.batch import Batch
from rlcore.api.reward import RewardProvider, place_sequence_scores
from rlcore.rewards.config import RewardConfig
from rlcore.rewards.errors import RewardError
from rlcore.rewards.functions import load_reward_function, reward_function_for
from rlcore.rewards.worker import CustomSpec, Item, Outcome, adopt_env, ping, reference, score_items

logger = logging.getLogger(__name__)

#: Seconds to wait for fresh worker processes to import what scoring needs.
STARTUP_TIMEOUT_S = 120.0
_CHUNKS_PER_WORKER = 4
_LOGGED_FAILURES = 3  # per step, with on_error=zero


class RuleRewardProvider(RewardProvider):
    """Scores ``response_text`` against ``ground_truth`` per ``data_source``.

    Reads objects ``response_text``, ``data_source``, ``ground_truth``, ``extra_info`` (optional) and
    ``index`` (optional, quoted in errors), and the tensor ``response_mask [B, R]``. Returns a batch with
    ``token_level_scores [B, R]`` (float32; each sample's score on its last response token), objects
    ``reward_extra_info`` (per sample, the keys a scorer returned beside ``score``), and
    ``meta["metrics"]`` with ``reward/errors`` and ``reward/timeouts`` (counts; nonzero only with
    ``on_error=zero``).

    ``backstop_grace_s`` is how long past the per-sample budget the driver waits for a worker before it
    kills the pool: the per-sample timer cannot interrupt a scorer stuck inside native code.
    """

    config_class = RewardConfig

    def __init__(self, config: RewardConfig | None = None, *, backstop_grace_s: float = 30.0):
        self.config = config or RewardConfig()
        self.backstop_grace_s = backstop_grace_s
        self._custom: CustomSpec = None
        if self.config.custom_function_path:
            path = os.path.abspath(self.config.custom_function_path)
            # Load once here so a bad path or name fails before any worker starts.
            load_reward_function(path, self.config.custom_function_name)
            self._custom = (path, self.config.custom_function_name, dict(self.config.custom_function_kwargs))
        self._executor: cf.ProcessPoolExecutor | None = None

    # -- scoring ---------------------------------------------------------------------------------
    def score(self, batch: Batch) -> Batch:
        texts = batch["response_text"]
        sources = batch["data_source"]
        truths = batch["ground_truth"]
        mask = batch["response_mask"]
        extras = batch.get("extra_info") or [None] * len(batch)
        # Unknown data sources fail here, before any work is sent.
        refs = (
            {} if self._custom is not None else {s: reference(reward_function_for(s)) for s in set(sources)}
        )
        items: list[Item] = [(i, sources[i], texts[i], truths[i], extras[i]) for i in range(len(batch))]
        outcomes = self._run(refs, items)

        scores = [0.0] * len(batch)
        extra_info: list[dict[str, Any]] = [{} for _ in range(len(batch))]
        failures = [o for o in outcomes if o[1] != "ok"]
        for row, status, payload in outcomes:
            if status == "ok":
                scores[row], extra_info[row] = payload
        if failures and self.config.on_error == "raise":
            raise RewardError(self._failure_message(failures, batch))
        for row, status, payload in failures[:_LOGGED_FAILURES]:
            logger.warning(
                "reward scored 0 for %s: %s", self._sample(batch, row), _first_line(status, payload)
            )
        if len(failures) > _LOGGED_FAILURES:
            logger.warning("reward scored 0 for %d more samples", len(failures) - _LOGGED_FAILURES)
        timeouts = sum(1 for o in failures if o[1] in ("timeout", "stuck"))
        return Batch(
            {"token_level_scores": place_sequence_scores(scores, mask)},
            {"reward_extra_info": extra_info},
            meta={"metrics": {"reward/errors": float(len(failures)), "reward/timeouts": float(timeouts)}},
        )

    def _run(self, refs: dict[str, str | None], items: list[Item]) -> list[Outcome]:
        if not items:
            return []
        if self.config.num_workers == 0:
            if threading.current_thread() is not threading.main_thread():
                logger.warning(
                    "reward.num_workers=0 off the main thread: reward.timeout_s cannot be enforced"
                )
            return score_items(self._custom, refs, items, self.config.timeout_s)
        executor = self._pool()
        n_chunks = min(len(items), self.config.num_workers * _CHUNKS_PER_WORKER)
        size = math.ceil(len(items) / n_chunks)
        chunks = [items[k : k + size] for k in range(0, len(items), size)]
        futures = {
            executor.submit(score_items, self._custom, refs, c, self.config.timeout_s): c for c in chunks
        }
        # Every sample is bounded by timeout_s in its worker; a worker that overruns this budget is stuck
        # where the timer cannot reach it.
        rounds = math.ceil(len(chunks) / self.config.num_workers)
        budget = rounds * size * self.config.timeout_s + self.backstop_grace_s
        done, pending = cf.wait(futures, timeout=budget)
        outcomes: list[Outcome] = []
        broken = False
        for future in done:
            try:
                outcomes.extend(future.result())
            except Exception as exc:  # the worker died (BrokenProcessPool) or its result did not pickle
                broken = broken or isinstance(exc, BrokenProcessPool)
                text = (
                    "the reward worker process died while scoring this chunk (a crash in native code, "
                    "os._exit or running out of memory in the scorer)"
                    if isinstance(exc, BrokenProcessPool)
                    else f"the scorer's result could not be sent back: {type(exc).__name__}: {exc}"
                )
                outcomes.extend((item[0], "error", text) for item in futures[future])
        for future in pending:
            outcomes.extend((item[0], "stuck", budget) for item in futures[future])
        if pending or broken:
            self._kill_pool()
        return sorted(outcomes, key=lambda o: o[0])

    def _pool(self) -> cf.ProcessPoolExecutor:
        if self._executor is not None:
            return self._executor
        methods = multiprocessing.get_all_start_methods()
        # forkserver children start from a clean server process, not a fork of a threaded driver, and
        # without re-importing the driver's main module as spawn does.
        context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        env = {k: v for k, v in os.environ.items() if k.startswith("RLCORE_")}
        executor = cf.ProcessPoolExecutor(
            self.config.num_workers, mp_context=context, initializer=adopt_env, initargs=(env,)
        )
        self._executor = executor
        pings = [executor.submit(ping, self._custom) for _ in range(self.config.num_workers)]
        done, pending = cf.wait(pings, timeout=STARTUP_TIMEOUT_S)
        errors = [f.exception() for f in done if f.exception() is not None]
        if pending or errors:
            self._kill_pool()
            why = (
                f"{type(errors[0]).__name__}: {errors[0]}"
                if errors
                else f"no answer in {STARTUP_TIMEOUT_S:.0f} s"
            )
            raise RewardError(
                f"reward worker processes failed to start ({why}). Set reward.num_workers=0 to score in "
                "the driver process and see the error directly."
            )
        return executor

    def _kill_pool(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        # Python 3.14 has ProcessPoolExecutor.kill_workers(); before it, the process table is private.
        procs = list((getattr(executor, "_processes", None) or {}).values())
        for proc in procs:
            proc.kill()
        executor.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.join(timeout=10)
        logger.warning(
            "killed reward worker processes %s; a new pool starts on the next step", [p.pid for p in procs]
        )

    def close(self) -> None:
        """Stop the worker processes."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    # -- messages --------------------------------------------------------------------------------
    def _scorer_name(self, data_source: str) -> str:
        if self._custom is not None:
            return f"{self._custom[0]}:{self._custom[1]}"
        from rlcore.plugins import registry

        entry = registry("reward_functions").entry(data_source)
        target = (
            entry.target if isinstance(entry.target, str) else reference(entry.target) or repr(entry.target)
        )
        return f"{target} (plugin {entry.plugin})"

    def _sample(self, batch: Batch, row: int) -> str:
        index = batch.get("index")
        where = f"batch row {row}" + (f" (dataset index {index[row]})" if index is not None else "")
        text = str(batch["response_text"][row])
        return f"{where}, data_source {batch['data_source'][row]!r}, response starts {text[:120]!r}"

    def _failure_message(self, failures: list[Outcome], batch: Batch) -> str:
        row, status, payload = failures[0]
        scorer = self._scorer_name(batch["data_source"][row])
        if status == "timeout":
            what = f"timed out after reward.timeout_s={self.config.timeout_s} s"
            fix = "Make the scorer faster or raise reward.timeout_s"
        elif status == "stuck":
            what = (
                f"did not return within {payload:.0f} s although each sample is limited to "
                f"reward.timeout_s={self.config.timeout_s} s: the scorer is stuck where the timer cannot "
                "interrupt it (native code, or SIGALRM blocked), so the worker processes were killed"
            )
            fix = "Fix the scorer"
        else:
            what = f"failed:\n{payload}"
            fix = "Fix the reward function"
        return (
            f"reward scoring failed on {len(failures)} of {len(batch)} samples. The first, {self._sample(batch, row)}, "
            f"scored by {scorer}, {what}\n{fix}, or set reward.on_error=zero to score such samples 0 and count "
            "them in the reward/errors metric."
        )


def _first_line(status: str, payload: Any) -> str:
    if status != "error":
        return status
    lines = str(payload).strip().splitlines()
    return lines[-1] if lines else status
