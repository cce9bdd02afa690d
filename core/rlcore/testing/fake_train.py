"""The fake train engine: :class:`TinyLM` with AdamW, data-parallel over torch.distributed.

See :mod:`rlcore.testing.fakes` for what the fakes are for.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as tdist

from rlcore.api import Batch, DistInfo, EngineSpec, LossFn, TrainEngine, WeightBucket
from rlcore.testing.fake_common import (
    Released,
    build_model,
    default_platform,
    offload_params,
    restore_params,
    spend,
)
from rlcore.testing.fake_config import FakeTrainConfig
from rlcore.testing.tiny_lm import token_log_probs
from rlcore.weights import bucketize

_HEAD_OUTPUTS = {"lm": ("log_probs", "entropy"), "value": ("values",), "score": ("scores",)}
_CHECKPOINT_FILE = "fake_engine.pt"


class FakeTrainEngine(TrainEngine):
    """A :class:`TinyLM` with AdamW, data-parallel over a torch.distributed group when ``world_size > 1``.

    ``released`` is the set of tags currently released (tests check it).
    """

    config_class = FakeTrainConfig
    heads = tuple(_HEAD_OUTPUTS)
    RELEASE_TAGS = ("weights", "grads", "optimizer")

    def __init__(
        self,
        spec: EngineSpec,
        config: FakeTrainConfig | None = None,
        platform=None,
        dist: DistInfo | None = None,
    ):
        super().__init__(spec, config or FakeTrainConfig(), default_platform(platform), dist or DistInfo())
        if spec.head not in _HEAD_OUTPUTS:
            raise ValueError(f"EngineSpec.head must be one of {sorted(_HEAD_OUTPUTS)}, got {spec.head!r}")
        if spec.lr_schedule not in ("constant", "cosine"):
            raise ValueError(
                f"EngineSpec.lr_schedule must be 'constant' or 'cosine', got {spec.lr_schedule!r}"
            )
        self.device = self.platform.set_device(self.dist.local_rank)
        self._init_process_group()
        self.model = build_model(self.config, spec.model_path, spec.head, spec.seed, spec.dtype).to(
            self.device
        )
        # A frozen role (reference, reward model) holds no optimizer state at all.
        self.optimizer = (
            torch.optim.AdamW(
                self.model.parameters(), lr=spec.lr, betas=tuple(spec.betas), weight_decay=spec.weight_decay
            )
            if spec.trainable
            else None
        )
        self.global_step = 0
        self._released = Released("FakeTrainEngine", self.RELEASE_TAGS)

    @property
    def released(self) -> set[str]:
        return set(self._released.tags)

    def _init_process_group(self) -> None:
        self._owns_group = False
        if self.dist.world_size <= 1:
            return
        if not tdist.is_initialized():
            tdist.init_process_group(
                self.platform.dist_backend,
                init_method=f"tcp://{self.dist.master_addr}:{self.dist.master_port}",
                rank=self.dist.rank,
                world_size=self.dist.world_size,
            )
            self._owns_group = True
        if tdist.get_world_size() != self.dist.world_size:
            raise RuntimeError(
                f"FakeTrainEngine: DistInfo.world_size={self.dist.world_size} but the initialised process "
                f"group has {tdist.get_world_size()} ranks"
            )

    def close(self) -> None:
        """Destroy the process group if this engine created it."""
        if self._owns_group and tdist.is_initialized():
            # Every rank done with its collectives before any tears gloo down: a rank destroying the group
            # while its peer still talks to it aborts the peer ("terminate called without an active
            # exception", 1-3 in 6 runs of the two-process test on the 2-core box). Bounded, so that a
            # rank closing after its peer died (failure tests) waits seconds, not the group's timeout.
            if tdist.get_backend() == "gloo":
                try:
                    tdist.monitored_barrier(timeout=timedelta(seconds=10))
                except RuntimeError:
                    pass  # a peer is gone: nothing left to wait for
            tdist.destroy_process_group()
            self._owns_group = False

    # -- forward ---------------------------------------------------------------------------------
    def _micro_batches(self, batch: Batch) -> list[Batch]:
        budget = self.spec.max_tokens_per_micro_batch
        if budget is None:
            return batch.split(self.spec.micro_batch_size) if len(batch) else []
        lengths = batch["attention_mask"].sum(1).tolist()
        groups, rows, used = [], [], 0
        for i, n in enumerate(lengths):
            if rows and used + n > budget:
                groups.append(rows)
                rows, used = [], 0
            rows.append(i)
            used += n
        if rows:
            groups.append(rows)
        return [batch.index(g) for g in groups]

    def _forward(self, mb: Batch) -> dict[str, torch.Tensor]:
        """Everything this engine's head produces for a micro-batch; see :class:`rlcore.api.LossFn`."""
        ids = mb["input_ids"].to(self.device)
        attn = mb["attention_mask"].to(self.device)
        out = self.model(ids, attn)
        if self.spec.head == "score":
            # Score at the last real token of each row (responses are right-padded).
            last = attn.shape[1] - 1 - attn.flip(1).long().argmax(1)
            return {"scores": out[torch.arange(out.shape[0], device=out.device), last]}
        responses = mb["responses"].to(self.device)
        r = responses.shape[1]
        mask = mb.get("response_mask")
        mask = (attn[:, -r:] if mask is None else mask.to(self.device)).to(out.dtype)
        # Position t predicts token t+1: the response tokens are predicted from positions -R-1 .. -2.
        head = out[:, -r - 1 : -1]
        if self.spec.head == "value":
            return {"values": head * mask}
        log_probs, entropy = token_log_probs(head, responses, self.spec.temperature)
        return {"log_probs": log_probs * mask, "entropy": entropy * mask}

    # -- TrainEngine -----------------------------------------------------------------------------
    def train_step(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        if not self.spec.trainable:
            raise RuntimeError("FakeTrainEngine.train_step: this engine was built with trainable=False")
        self._released.require("train_step", "weights", "optimizer")
        spend(self.config.step_cost_s)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, metric_sums, micro = 0.0, {}, 0
        for mb in self._micro_batches(batch):
            loss, metrics = loss_fn(self._forward(mb), mb)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise TypeError(f"loss_fn must return a scalar tensor as its loss, got {loss!r}")
            # Summed, not averaged: the loss is already normalised by the global token count.
            loss.backward()
            loss_sum += float(loss.detach())
            for k, v in metrics.items():
                metric_sums[k] = metric_sums.get(k, 0.0) + float(v)
            micro += 1
        params = list(self.model.parameters())
        for p in params:
            if p.grad is None:  # a rank without rows still joins the all-reduce
                p.grad = torch.zeros_like(p)
        keys = sorted(metric_sums)
        if self.dist.world_size > 1:
            # A rank that got no rows has no metric names of its own; every rank must reduce the same
            # vector, or the collective never completes.
            gathered: list[list[str]] = [[] for _ in range(self.dist.world_size)]
            tdist.all_gather_object(gathered, keys)
            keys = sorted({k for rank_keys in gathered for k in rank_keys})
        stats = torch.tensor([loss_sum, micro, *(metric_sums.get(k, 0.0) for k in keys)], dtype=torch.float64)
        if self.dist.world_size > 1:
            for p in params:
                tdist.all_reduce(p.grad, op=tdist.ReduceOp.SUM)
            stats = stats.to(self.device)
            tdist.all_reduce(stats, op=tdist.ReduceOp.SUM)
            stats = stats.cpu()
        clip = self.spec.grad_clip if self.spec.grad_clip and self.spec.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        lr = self.spec.lr * self._lr_factor(self.global_step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        n_micro = max(float(stats[1]), 1.0)
        result = {"loss": float(stats[0]), "grad_norm": grad_norm, "lr": lr}
        result.update({k: float(stats[2 + i]) / n_micro for i, k in enumerate(keys)})
        return result

    def _lr_factor(self, step: int) -> float:
        spec = self.spec
        if step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        if spec.lr_schedule == "cosine" and spec.total_steps > spec.warmup_steps:
            progress = min(1.0, (step - spec.warmup_steps) / (spec.total_steps - spec.warmup_steps))
            return spec.min_lr_ratio + (1 - spec.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    def infer(self, batch: Batch, outputs: Sequence[str] = ("log_probs",)) -> Batch:
        if isinstance(outputs, str):
            outputs = [outputs]
        allowed = _HEAD_OUTPUTS[self.spec.head]
        wrong = [o for o in outputs if o not in allowed]
        if wrong:
            raise ValueError(
                f"FakeTrainEngine with head {self.spec.head!r} computes {list(allowed)}, not {wrong}"
            )
        self._released.require("infer", "weights")
        spend(self.config.infer_cost_s)
        self.model.eval()
        parts: dict[str, list[torch.Tensor]] = {o: [] for o in outputs}
        with torch.no_grad():
            for mb in self._micro_batches(batch):
                result = self._forward(mb)
                for o in outputs:
                    parts[o].append(result[o].cpu())
        if not len(batch):
            width = () if self.spec.head == "score" else (batch["responses"].shape[1],)
            return Batch({o: torch.zeros((0, *width)) for o in outputs})
        return Batch({o: torch.cat(v) for o, v in parts.items()})

    def export_weights(self, dtype: torch.dtype, bucket_bytes: int) -> Iterator[WeightBucket]:
        self._released.require("export_weights", "weights")
        # Clones: the stream is a snapshot, unaffected by later optimizer steps.
        named = ((name, p.detach().clone()) for name, p in self.model.named_parameters())
        return bucketize(named, bucket_bytes, dtype)

    def release(self, tags: Sequence[str]) -> None:
        for tag in self._released.check(tags):
            if tag in self._released.tags:
                continue
            if tag == "weights":
                self._released.stash["weights"] = offload_params(self.model)
            elif tag == "optimizer" and self.optimizer is not None:
                self._released.stash["optimizer"] = _to_cpu(self.optimizer.state_dict())
                self.optimizer.state.clear()
            elif tag == "grads":  # none are kept between steps, so there is nothing to copy
                for p in self.model.parameters():
                    p.grad = None
            self._released.tags.add(tag)
        self.platform.empty_cache()  # hand the freed device memory back

    def resume(self, tags: Sequence[str]) -> None:
        tags = self._released.check(tags)
        # Weights first: optimizer state is placed next to its parameters.
        for tag in sorted(tags, key=lambda t: t != "weights"):
            if tag not in self._released.tags:
                continue
            stash = self._released.stash.pop(tag, None)
            if tag == "weights":
                restore_params(self.model, stash, self.device)
            elif tag == "optimizer" and stash is not None:
                self.optimizer.load_state_dict(stash)
            self._released.tags.discard(tag)

    # -- files -----------------------------------------------------------------------------------
    def _shape(self) -> dict:
        m = self.model
        return {
            "vocab_size": m.vocab_size,
            "hidden_size": m.hidden_size,
            "prev_token": m.prev_token,
            "head": m.head,
        }

    def _barrier(self) -> None:
        if self.dist.world_size > 1:
            tdist.barrier()

    def save_checkpoint(self, path: str) -> None:
        self._released.require("save_checkpoint", "weights", "optimizer")
        if self.dist.rank == 0:
            state = {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "global_step": self.global_step,
                "shape": self._shape(),
            }
            with _atomic_dir(path) as tmp:
                torch.save(state, tmp / _CHECKPOINT_FILE)
        self._barrier()

    def load_checkpoint(self, path: str) -> None:
        self._released.require("load_checkpoint", "weights", "optimizer")
        file = Path(path) / _CHECKPOINT_FILE
        if not file.is_file():
            raise FileNotFoundError(f"no FakeTrainEngine checkpoint at {path} (missing {_CHECKPOINT_FILE})")
        state = torch.load(file, map_location=self.device, weights_only=True)
        if state["shape"] != self._shape():
            raise ValueError(
                f"checkpoint {path} holds a TinyLM {state['shape']}, but this engine's model is {self._shape()}"
            )
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.global_step = int(state["global_step"])

    def export_hf(self, path: str) -> None:
        from safetensors.torch import save_file

        self._released.require("export_hf", "weights")
        if self.dist.rank == 0:
            tensors = {n: p.detach().contiguous().cpu() for n, p in self.model.named_parameters()}
            config = {
                "architectures": ["RlcoreTinyLM"],
                "model_type": "rlcore_tiny_lm",
                "torch_dtype": self.spec.dtype,
                **self._shape(),
            }
            with _atomic_dir(path) as tmp:
                save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
                (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
                _copy_tokenizer(self.spec.model_path, tmp)
        self._barrier()


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


class _atomic_dir:
    """``with _atomic_dir(path) as tmp``: write into ``tmp``; on success it replaces ``path`` whole,
    so a crash mid-write never leaves a half-written folder under ``path``."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")

    def __enter__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir()
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        old = self.path.with_name(f".{self.path.name}.old-{os.getpid()}")
        if self.path.exists():
            self.path.rename(old)
        self.tmp.rename(self.path)
        shutil.rmtree(old, ignore_errors=True)


def _copy_tokenizer(model_path: str, dest: Path) -> None:
    """Copy tokenizer files from the source model folder, so the export is a loadable model folder."""
    src = Path(model_path) if model_path else None
    if src is None or not src.is_dir():
        return
    for f in src.iterdir():
        if f.is_file() and (
            f.name.startswith("tokenizer")
            or f.name in ("special_tokens_map.json", "vocab.json", "merges.txt")
        ):
            shutil.copy2(f, dest / f.name)
