"""Contract suites that every engine plugin runs against itself (third-party plugins too).

A suite is a class of tests; a plugin subclasses it in its own tests and provides one fixture that
builds its engine. The tests check the contract of :class:`rlcore.api.TrainEngine` /
:class:`rlcore.api.RolloutEngine` with real computation on small random batches: losses go down,
log-probs are finite log-probabilities that ignore padding, checkpoints and release/resume preserve
outputs exactly, the weight stream is complete and byte-bounded, sampling honours its parameters, and
weight loads take effect. The ``tiny_model_path`` fixture (rlcore's pytest plugin, loaded automatically
once rlcore is installed) gives a tiny Qwen2 model folder built locally, without a hub::

    # tests/test_contract.py of rlcore-myengine
    import pytest
    from safetensors.torch import load_file

    from rlcore.api import DistInfo, EngineSpec, RolloutSpec
    from rlcore.devices import get_platform
    from rlcore.testing.contract import RolloutEngineContract, TrainEngineContract
    from rlcore_myengine.config import MyConfig, MyRolloutConfig
    from rlcore_myengine.engine import MyEngine, MyRollout


    class TestMyEngine(TrainEngineContract):
        heads = ("lm", "value")  # the heads the engine supports

        @pytest.fixture
        def make_train_engine(self, tiny_model_path):
            def make(**spec_overrides):
                spec = EngineSpec(model_path=str(tiny_model_path), **spec_overrides)
                return MyEngine(spec, MyConfig(), get_platform("cpu"), DistInfo())
            return make


    class TestMyRollout(RolloutEngineContract):
        @pytest.fixture(scope="class")
        @classmethod
        def rollout_engine(cls, tiny_model_path):
            engine = MyRollout(RolloutSpec(model_path=str(tiny_model_path)), MyRolloutConfig(), get_platform("cpu"))
            yield engine
            engine.shutdown()

        @pytest.fixture(scope="class")
        @classmethod
        def rollout_weights(cls, tiny_model_path):
            # The engine's current weights as (hf_name, tensor), as a trainer would send them.
            return sorted(load_file(str(tiny_model_path / "model.safetensors")).items())

Select only contract tests with ``pytest -m rlcore_contract``. Class attributes (``vocab_low``,
``vocab_high``, ``layout_atol`` ...) tune the suite to an engine; see each class.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch

from rlcore.api import Batch, SamplingParams
from rlcore.testing.rollout_values import RolloutValueChecks
from rlcore.weights import assemble, bucketize, tensor_bytes

# Every assert here carries a message with the values it compared: pytest also rewrites this module
# (registered in rlcore.testing's __init__), but not under ``--assert=plain`` or ``python -O``.

__all__ = [
    "RolloutEngineContract",
    "TrainEngineContract",
    "contract_batch",
    "token_nll_loss",
    "value_mse_loss",
]


def token_nll_loss(outputs: dict[str, torch.Tensor], batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative log-likelihood of the response tokens, summed and divided by ``meta["global_tokens"]``
    (a :data:`rlcore.api.LossFn`; picklable, as it is a module-level function)."""
    mask = batch["response_mask"].to(outputs["log_probs"].dtype)
    loss = -(outputs["log_probs"] * mask).sum() / batch.meta["global_tokens"]
    return loss, {"nll": float(loss.detach())}


def value_mse_loss(outputs: dict[str, torch.Tensor], batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Squared error of ``values`` against ``returns`` over response tokens, per global token."""
    mask = batch["response_mask"].to(outputs["values"].dtype)
    err = (outputs["values"] - batch["returns"].to(outputs["values"].dtype)) ** 2
    loss = 0.5 * (err * mask).sum() / batch.meta["global_tokens"]
    return loss, {"mse": float(loss.detach())}


def contract_batch(
    batch_size: int = 4, *, vocab_low: int, vocab_high: int, pad_token_id: int = 0, seed: int = 0
) -> Batch:
    """A left-padded-prompt / right-padded-response batch of random tokens, lengths varying by row.

    Tensors follow :mod:`rlcore.api.batch`; ``returns [B, R]`` is a value target, and ``meta`` holds
    ``global_tokens`` / ``global_sequences`` as the controller sets them.
    """
    g = torch.Generator().manual_seed(seed)
    prompt_lens = [1 + (3 * i + seed) % 5 for i in range(batch_size)]  # a 1-token prompt is the hardest case
    response_lens = [1 + (2 * i + 1 + seed) % 5 for i in range(batch_size)]
    p, r = max(prompt_lens), max(response_lens)
    prompts = torch.full((batch_size, p), pad_token_id, dtype=torch.long)
    responses = torch.full((batch_size, r), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros(batch_size, p, dtype=torch.long)
    response_mask = torch.zeros(batch_size, r, dtype=torch.long)
    for i, (lp, lr) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        prompts[i, p - lp :] = torch.randint(vocab_low, vocab_high, (lp,), generator=g)
        responses[i, :lr] = torch.randint(vocab_low, vocab_high, (lr,), generator=g)
        prompt_mask[i, p - lp :] = 1
        response_mask[i, :lr] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "returns": torch.rand(batch_size, r, generator=g) * response_mask,
    }
    meta = {"global_tokens": int(response_mask.sum()), "global_sequences": batch_size}
    return Batch(tensors, meta=meta)


def _row_alone(batch: Batch, i: int) -> Batch:
    """Row ``i`` of ``batch`` with all its padding removed (a batch of one)."""
    pm = batch["attention_mask"][i, : batch["prompts"].shape[1]].bool()
    rm = batch["response_mask"][i].bool()
    prompt, response = batch["prompts"][i][pm][None], batch["responses"][i][rm][None]
    ids = torch.cat([prompt, response], 1)
    ones = torch.ones_like(ids)
    tensors = {
        "prompts": prompt,
        "responses": response,
        "input_ids": ids,
        "attention_mask": ones,
        "position_ids": torch.arange(ids.shape[1])[None],
        "response_mask": torch.ones_like(response),
        "returns": batch["returns"][i][rm][None],
    }
    return Batch(tensors, meta={"global_tokens": int(rm.sum()), "global_sequences": 1})


def _context(what: str):
    """A ``msg`` for :func:`torch.testing.assert_close` that says which check failed above its numbers."""
    return lambda detail: f"{what}\n{detail}"


def _assert_finite_metrics(metrics: dict[str, float]) -> None:
    for key in ("loss", "grad_norm", "lr"):
        assert key in metrics, f"train_step metrics lack {key!r}: {sorted(metrics)}"
        assert math.isfinite(float(metrics[key])), f"train_step metric {key}={metrics[key]} is not finite"


class TrainEngineContract:
    """The :class:`rlcore.api.TrainEngine` contract. Provide the fixture ``make_train_engine``: a
    callable ``make(**spec_overrides) -> TrainEngine`` building a fresh engine (same seed each time) on one
    process, where ``spec_overrides`` are :class:`rlcore.api.EngineSpec` fields."""

    pytestmark = [pytest.mark.rlcore_contract]

    #: Token ids of test batches are drawn from ``[vocab_low, vocab_high)``; pad id ``pad_token_id``.
    vocab_low, vocab_high, pad_token_id = 3, 200, 0
    #: Heads the engine supports, among ``"lm"``, ``"value"``, ``"score"``.
    heads: tuple[str, ...] = ("lm",)
    #: Learning rate and step count of the loss-decrease check.
    train_lr, train_steps = 1e-2, 5
    #: Tolerance when the same numbers are computed in a different layout (padding, micro-batches).
    layout_atol = 1e-4

    @pytest.fixture
    def make_train_engine(self):
        pytest.fail(
            f"{type(self).__name__} must define the fixture make_train_engine (see rlcore.testing.contract)"
        )

    def batch(self, seed: int = 0, batch_size: int = 4) -> Batch:
        return contract_batch(
            batch_size,
            vocab_low=self.vocab_low,
            vocab_high=self.vocab_high,
            pad_token_id=self.pad_token_id,
            seed=seed,
        )

    def test_train_step_decreases_loss(self, make_train_engine):
        engine = make_train_engine(lr=self.train_lr, micro_batch_size=2)
        batch = self.batch()
        before = engine.infer(batch, ["log_probs"])["log_probs"]
        losses = []
        for _ in range(self.train_steps):
            metrics = engine.train_step(batch, token_nll_loss)
            _assert_finite_metrics(metrics)
            assert metrics["lr"] == pytest.approx(self.train_lr), (
                f"train_step reported lr={metrics['lr']}, expected the configured {self.train_lr} "
                "(constant schedule, no warm-up)"
            )
            assert metrics["grad_norm"] > 0, (
                f"train_step reported grad_norm={metrics['grad_norm']}, expected > 0 (no gradient flowed)"
            )
            losses.append(metrics["loss"])
        assert losses[-1] < losses[0], f"loss did not decrease over {self.train_steps} steps: {losses}"
        # The first step's loss is computed before any update: it must equal the NLL measured by infer.
        nll_before = float(-(before * batch["response_mask"]).sum() / batch.meta["global_tokens"])
        assert losses[0] == pytest.approx(nll_before, rel=1e-4, abs=self.layout_atol), (
            f"first train_step loss {losses[0]!r} != NLL of infer's log-probs {nll_before!r} "
            f"(difference {losses[0] - nll_before:.3g}, allowed rel 1e-4 / abs {self.layout_atol}): "
            "train_step and infer disagree on the log-probs of the same batch"
        )
        after = engine.infer(batch, ["log_probs"])["log_probs"]
        ll_before = float((before * batch["response_mask"]).sum())
        ll_after = float((after * batch["response_mask"]).sum())
        assert ll_after > ll_before, (
            f"log-likelihood of the trained batch by infer went {ll_before!r} -> {ll_after!r} over "
            f"{self.train_steps} steps; expected it to rise"
        )

    def test_micro_batches_sum_gradients(self, make_train_engine):
        # One micro-batch of 4 rows or four of one row: the same loss and gradient (summed, not averaged).
        batch = self.batch(seed=1)
        whole = make_train_engine(lr=self.train_lr, micro_batch_size=4).train_step(batch, token_nll_loss)
        split = make_train_engine(lr=self.train_lr, micro_batch_size=1).train_step(batch, token_nll_loss)
        for key in ("loss", "grad_norm"):
            assert split[key] == pytest.approx(whole[key], rel=1e-4, abs=self.layout_atol), (
                f"{key}: {split[key]!r} with micro_batch_size=1, {whole[key]!r} with micro_batch_size=4 "
                f"(allowed rel 1e-4 / abs {self.layout_atol}): micro-batches must sum, not average"
            )

    def test_infer_log_probs_and_entropy(self, make_train_engine):
        engine = make_train_engine()
        batch = self.batch()
        out = engine.infer(batch, ["log_probs", "entropy"])
        b, r = batch["responses"].shape
        mask = batch["response_mask"].bool()
        for key in ("log_probs", "entropy"):
            assert tuple(out[key].shape) == (b, r), (
                f"{key} has shape {tuple(out[key].shape)}, expected {(b, r)}"
            )
            assert torch.isfinite(out[key][mask]).all(), (
                f"{key} has non-finite values on response tokens: {out[key][mask].tolist()}"
            )
        largest = float(out["log_probs"][mask].max())
        assert largest <= 1e-6, f"log-probs must be <= 0, the largest is {largest!r}"
        smallest = float(out["entropy"][mask].min())
        assert smallest >= -1e-6, f"entropy must be >= 0, the smallest is {smallest!r}"
        again = engine.infer(batch, ["log_probs", "entropy"])
        for key in ("log_probs", "entropy"):
            torch.testing.assert_close(
                again[key], out[key], rtol=0, atol=0, msg=_context(f"{key}: infer twice on one batch differs")
            )

    def test_infer_ignores_padding(self, make_train_engine):
        engine = make_train_engine()
        batch = self.batch()
        out = engine.infer(batch, ["log_probs"])["log_probs"]
        mask = batch["response_mask"].bool()
        # Garbage in padded slots must not change any real token's log-prob.
        noisy = Batch(dict(batch.tensors), meta=batch.meta)
        junk = torch.randint(
            self.vocab_low,
            self.vocab_high,
            batch["input_ids"].shape,
            generator=torch.Generator().manual_seed(7),
        )
        noisy.tensors["input_ids"] = torch.where(batch["attention_mask"].bool(), batch["input_ids"], junk)
        p = batch["prompts"].shape[1]
        noisy.tensors["prompts"] = noisy["input_ids"][:, :p]
        noisy.tensors["responses"] = noisy["input_ids"][:, p:]
        out_noisy = engine.infer(noisy, ["log_probs"])["log_probs"]
        torch.testing.assert_close(
            out_noisy[mask],
            out[mask],
            rtol=0,
            atol=self.layout_atol,
            msg=_context("log_probs changed when only padded slots of input_ids changed"),
        )
        # Each row alone, without any padding, matches its row in the padded batch.
        for i in range(len(batch)):
            alone = engine.infer(_row_alone(batch, i), ["log_probs"])["log_probs"][0]
            torch.testing.assert_close(
                alone,
                out[i][mask[i]],
                rtol=0,
                atol=self.layout_atol,
                msg=_context(f"log_probs of row {i} alone (no padding) differ from that row in the batch"),
            )

    def test_value_head(self, make_train_engine):
        if "value" not in self.heads:
            pytest.skip("engine does not declare the value head (set heads = (..., 'value'))")
        engine = make_train_engine(head="value", lr=self.train_lr, micro_batch_size=2)
        batch = self.batch()
        values = engine.infer(batch, ["values"])["values"]
        assert tuple(values.shape) == tuple(batch["responses"].shape), (
            f"values has shape {tuple(values.shape)}, expected {tuple(batch['responses'].shape)} "
            "(that of responses)"
        )
        real = values[batch["response_mask"].bool()]
        assert torch.isfinite(real).all(), f"values has non-finite values on response tokens: {real.tolist()}"
        losses = [engine.train_step(batch, value_mse_loss)["loss"] for _ in range(self.train_steps)]
        assert losses[-1] < losses[0], f"value loss did not decrease: {losses}"

    def test_score_head(self, make_train_engine):
        if "score" not in self.heads:
            pytest.skip("engine does not declare the score head (set heads = (..., 'score'))")
        engine = make_train_engine(head="score")
        batch = self.batch()
        scores = engine.infer(batch, ["scores"])["scores"]
        assert tuple(scores.shape) == (len(batch),), (
            f"scores has shape {tuple(scores.shape)}, expected ({len(batch)},)"
        )
        assert torch.isfinite(scores).all(), f"scores has non-finite values: {scores.tolist()}"
        # A sequence score is read at the last real token: the row alone, unpadded, scores the same.
        for i in range(len(batch)):
            alone = engine.infer(_row_alone(batch, i), ["scores"])["scores"]
            torch.testing.assert_close(
                alone[0],
                scores[i],
                rtol=0,
                atol=self.layout_atol,
                msg=_context(f"score of row {i} alone (no padding) differs from that row in the batch"),
            )

    def test_export_weights(self, make_train_engine):
        engine = make_train_engine(lr=self.train_lr)
        full = [(n, t.clone()) for n, t in assemble(engine.export_weights(torch.float32, 1 << 40))]
        names = [n for n, _ in full]
        twice = sorted({n for n in names if names.count(n) > 1})
        assert not twice, f"export_weights yields these names more than once: {twice}"
        sharded = [n for n in names if "@" in n]
        assert not sharded, f"assembled names must be plain Hugging Face names, got {sharded}"
        bound = max(tensor_bytes(t) for _, t in full) // 3  # forces the largest tensors to be split
        buckets = list(engine.export_weights(torch.float32, bound))
        for bucket in buckets:
            size = sum(tensor_bytes(t) for _, t in bucket)
            largest_element = max(t.element_size() for _, t in bucket)
            assert size <= max(bound, largest_element), f"a bucket holds {size} bytes, bound {bound}"
        pieces = dict(assemble(buckets))
        assert sorted(pieces) == sorted(names), (
            f"export_weights with a {bound}-byte bound lacks {sorted(set(names) - set(pieces))} and adds "
            f"{sorted(set(pieces) - set(names))}, compared with one unbounded bucket"
        )
        for name, tensor in full:
            assert torch.equal(pieces[name], tensor), f"{name} differs between bucket sizes"
        half = dict(assemble(engine.export_weights(torch.bfloat16, 1 << 20)))
        for name, tensor in full:
            assert half[name].dtype == torch.bfloat16, (
                f"export_weights(torch.bfloat16) gave {name} as {half[name].dtype}"
            )
            assert torch.equal(half[name], tensor.to(torch.bfloat16)), (
                f"{name} in bfloat16 is not a plain cast"
            )
        engine.train_step(self.batch(), token_nll_loss)
        trained = dict(assemble(engine.export_weights(torch.float32, 1 << 40)))
        changed = [n for n, t in full if not torch.equal(trained[n], t)]
        assert changed, "export_weights after a train step returns the old weights"

    def test_checkpoint_round_trip(self, make_train_engine, tmp_path):
        batch, other = self.batch(), self.batch(seed=3)
        first = make_train_engine(lr=self.train_lr)
        first.train_step(batch, token_nll_loss)
        first.save_checkpoint(str(tmp_path / "ckpt"))
        second = make_train_engine(lr=self.train_lr)
        second.load_checkpoint(str(tmp_path / "ckpt"))
        a, b = first.infer(other, ["log_probs"]), second.infer(other, ["log_probs"])
        torch.testing.assert_close(
            b["log_probs"],
            a["log_probs"],
            rtol=0,
            atol=0,
            msg=_context("log_probs of an engine loaded from the checkpoint differ from the saved engine's"),
        )
        # The optimizer state came back too: the next step is the same step.
        ma, mb = first.train_step(batch, token_nll_loss), second.train_step(batch, token_nll_loss)
        assert mb["loss"] == pytest.approx(ma["loss"], rel=1e-6), (
            f"the step after load_checkpoint has loss {mb['loss']!r}, "
            f"the next step of the engine that saved it {ma['loss']!r}"
        )
        a, b = first.infer(other, ["log_probs"]), second.infer(other, ["log_probs"])
        torch.testing.assert_close(
            b["log_probs"],
            a["log_probs"],
            rtol=1e-6,
            atol=1e-6,
            msg=_context("after one more step each, the loaded engine's log_probs differ (optimizer state?)"),
        )

    def test_release_resume_keeps_state(self, make_train_engine):
        batch = self.batch()
        moved, kept = make_train_engine(lr=self.train_lr), make_train_engine(lr=self.train_lr)
        moved.train_step(batch, token_nll_loss)
        kept.train_step(batch, token_nll_loss)
        tags = ["weights", "grads", "optimizer"]
        moved.release(tags)
        moved.resume(tags)
        torch.testing.assert_close(
            moved.infer(batch, ["log_probs"])["log_probs"],
            kept.infer(batch, ["log_probs"])["log_probs"],
            rtol=0,
            atol=0,
            msg=_context(f"log_probs after release({tags}) + resume differ from an engine never released"),
        )
        ma, mk = moved.train_step(batch, token_nll_loss), kept.train_step(batch, token_nll_loss)
        for key in ("loss", "grad_norm"):
            assert ma[key] == mk[key], (
                f"{key} of the step after release/resume is {ma[key]!r}, {mk[key]!r} without it"
            )
        torch.testing.assert_close(
            moved.infer(batch, ["log_probs"])["log_probs"],
            kept.infer(batch, ["log_probs"])["log_probs"],
            rtol=0,
            atol=0,
            msg=_context("after one more step each, log_probs of the released/resumed engine differ"),
        )

    def test_lora_adapter(self, make_train_engine):
        """Engines with ``supports_lora``: a fresh adapter computes the base model; training moves the
        adapted log-probs and leaves ``base_log_probs`` on the base; ``export_adapter`` streams
        ``<module>.lora_A/B.weight`` only; ``export_weights`` (merged) keeps the base model's names.
        Engines without: they export no adapter (runs refuse ``actor.lora`` for them by the flag)."""
        from rlcore.adapters import is_adapter_name
        from rlcore.api import LoraSpec

        full = make_train_engine()
        if not getattr(full, "supports_lora", False):
            with pytest.raises(NotImplementedError):
                full.export_adapter(torch.float32, 1 << 20)
            return
        engine = make_train_engine(lora=LoraSpec(rank=4, alpha=8.0), lr=self.train_lr)
        batch = self.batch()
        base = full.infer(batch, ["log_probs"])["log_probs"]
        fresh = engine.infer(batch, ["log_probs", "base_log_probs"])
        for key in ("log_probs", "base_log_probs"):
            torch.testing.assert_close(
                fresh[key], base, rtol=0, atol=self.layout_atol, msg=_context(f"{key} of a fresh adapter")
            )
        for _ in range(self.train_steps):
            engine.train_step(batch, token_nll_loss)
        trained = engine.infer(batch, ["log_probs", "base_log_probs"])
        torch.testing.assert_close(
            trained["base_log_probs"],
            base,
            rtol=0,
            atol=self.layout_atol,
            msg=_context("base_log_probs after training"),
        )
        assert float((trained["log_probs"] - base).abs().max()) > 1e-3, "training the adapter changed nothing"
        adapter = [name for name, _ in assemble(engine.export_adapter(torch.float32, 1 << 20))]
        assert adapter and all(is_adapter_name(n) for n in adapter), f"export_adapter streamed {adapter[:4]}"
        merged = {name for name, _ in assemble(engine.export_weights(torch.float32, 1 << 20))}
        plain = {name for name, _ in assemble(full.export_weights(torch.float32, 1 << 20))}
        assert merged == plain, f"merged weights name {sorted(merged ^ plain)[:4]} unlike the full engine's"

    def test_export_hf(self, make_train_engine, tmp_path):
        from safetensors.torch import load_file

        engine = make_train_engine()
        out = tmp_path / "hf"
        engine.export_hf(str(out))
        assert (out / "config.json").is_file(), "export_hf wrote no config.json"
        json.loads((out / "config.json").read_text())  # a JSONDecodeError names the line and column
        files = sorted(out.glob("*.safetensors"))
        assert files, f"export_hf wrote no *.safetensors under {out}"
        stream = dict(assemble(engine.export_weights(torch.float32, 1 << 40)))
        saved = {k: v for f in files for k, v in load_file(str(f)).items()}
        unknown = sorted(set(saved) - set(stream))
        assert not unknown, f"export_hf names tensors the weight stream lacks: {unknown}"
        for name, tensor in saved.items():
            assert torch.equal(tensor, stream[name].to(tensor.dtype)), f"{name} differs from export_weights"


class RolloutEngineContract(RolloutValueChecks):
    """The :class:`rlcore.api.RolloutEngine` contract. Provide two fixtures (any scope): ``rollout_engine``
    (a built engine; tests restore any weights they change) and ``rollout_weights`` (the engine's current
    weights as a list of ``(hf_name, tensor)``, what a trainer would send).

    The value checks (:mod:`rlcore.testing.rollout_values`) compare log-probs, greedy tokens and filters
    with a float64 reference built from ``rollout_weights`` and the fixture ``reference_model_path``
    (default ``tiny_model_path``); override ``reference_logits`` for a model that is not Hugging Face's."""

    pytestmark = [pytest.mark.rlcore_contract]

    #: Prompt token ids are drawn from ``[vocab_low, vocab_high)``.
    vocab_low, vocab_high = 3, 200
    max_tokens = 8
    #: Tolerance for log-probs of the same tokens computed twice.
    logprob_atol = 1e-4

    @pytest.fixture
    def rollout_engine(self):
        pytest.fail(
            f"{type(self).__name__} must define the fixture rollout_engine (see rlcore.testing.contract)"
        )

    @pytest.fixture
    def rollout_weights(self):
        pytest.fail(
            f"{type(self).__name__} must define the fixture rollout_weights (see rlcore.testing.contract)"
        )

    def prompts(self, count: int = 3, seed: int = 0) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        return [
            torch.randint(self.vocab_low, self.vocab_high, (1 + 2 * i,), generator=g).tolist()
            for i in range(count)
        ]

    def greedy(self, engine, prompts=None):
        params = SamplingParams(n=1, temperature=0.0, max_tokens=self.max_tokens)
        return [c[0] for c in engine.generate(prompts or self.prompts(), params)]

    def assert_same_greedy(self, got, want) -> None:
        assert len(got) == len(want), f"{len(got)} completions, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.token_ids == w.token_ids, (
                f"greedy tokens of prompt {i}: got {list(g.token_ids)}, expected {list(w.token_ids)}"
            )
            torch.testing.assert_close(
                torch.tensor(g.log_probs),
                torch.tensor(w.log_probs),
                rtol=0,
                atol=self.logprob_atol,
                msg=_context(f"log-probs of the greedy tokens of prompt {i}"),
            )

    def test_generate_shapes_and_log_probs(self, rollout_engine):
        prompts = self.prompts()
        params = SamplingParams(n=3, temperature=1.0, max_tokens=self.max_tokens, seed=0)
        out = rollout_engine.generate(prompts, params)
        assert len(out) == len(prompts), f"generate returned {len(out)} lists for {len(prompts)} prompts"
        for prompt, completions in zip(prompts, out, strict=True):
            assert len(completions) == 3, (
                f"generate returned {len(completions)} completions for n=3 (must be n per prompt)"
            )
            for c in completions:
                assert list(c.prompt_ids) == prompt, f"prompt_ids {list(c.prompt_ids)}, expected {prompt}"
                assert 1 <= len(c.token_ids) <= self.max_tokens, (
                    f"{len(c.token_ids)} tokens, expected 1 to max_tokens={self.max_tokens}"
                )
                assert c.finish_reason in ("stop", "length"), (
                    f"finish_reason {c.finish_reason!r}, expected 'stop' or 'length'"
                )
                if c.finish_reason == "length":
                    assert len(c.token_ids) == self.max_tokens, (
                        f"finish_reason 'length' after {len(c.token_ids)} tokens, "
                        f"expected max_tokens={self.max_tokens}"
                    )
                assert c.log_probs is not None and len(c.log_probs) == len(c.token_ids), (
                    f"log_probs {c.log_probs} for {len(c.token_ids)} tokens: expected one per token"
                )
                lp = torch.tensor(c.log_probs)
                assert torch.isfinite(lp).all() and (lp <= 1e-6).all(), f"bad log-probs {c.log_probs}"

    def test_greedy_is_deterministic(self, rollout_engine):
        first, second = self.greedy(rollout_engine), self.greedy(rollout_engine)
        self.assert_same_greedy(second, first)
        twins = rollout_engine.generate(
            self.prompts()[:1], SamplingParams(n=2, temperature=0.0, max_tokens=self.max_tokens)
        )
        got = [list(c.token_ids) for c in twins[0]]
        assert got == [list(first[0].token_ids)] * 2, (
            f"greedy with n=2 gave {got}, expected twice {list(first[0].token_ids)}"
        )

    def test_top_k_one_is_greedy(self, rollout_engine):
        params = SamplingParams(n=2, temperature=1.0, top_k=1, max_tokens=self.max_tokens, seed=3)
        greedy = self.greedy(rollout_engine)
        out = rollout_engine.generate(self.prompts(), params)
        for i, (completions, g) in enumerate(zip(out, greedy, strict=True)):
            got = [list(c.token_ids) for c in completions]
            assert got == [list(g.token_ids)] * 2, (
                f"top_k=1 sampling of prompt {i} gave {got}, expected twice the greedy {list(g.token_ids)}"
            )

    def test_request_seed_reproduces_samples(self, rollout_engine):
        params = SamplingParams(n=2, temperature=1.0, max_tokens=self.max_tokens, seed=11)
        first = rollout_engine.generate(self.prompts(), params)
        second = rollout_engine.generate(self.prompts(), params)
        first_ids = [[list(c.token_ids) for c in cs] for cs in first]
        second_ids = [[list(c.token_ids) for c in cs] for cs in second]
        assert second_ids == first_ids, (
            f"two requests with seed=11 sampled {first_ids} then {second_ids}: the seed must reproduce"
        )

    def test_load_current_weights_keeps_outputs(self, rollout_engine, rollout_weights):
        before = self.greedy(rollout_engine)
        bound = max(tensor_bytes(t) for _, t in rollout_weights) // 2  # split the largest tensors
        rollout_engine.load_weights(bucketize(rollout_weights, bound))
        self.assert_same_greedy(self.greedy(rollout_engine), before)

    def test_load_weights_takes_effect(self, rollout_engine, rollout_weights):
        before = self.greedy(rollout_engine)
        g = torch.Generator().manual_seed(0)
        # Equal tensors get the same perturbation, so tied weights (embedding and lm_head) stay tied.
        done: list[tuple[torch.Tensor, torch.Tensor]] = []
        noisy = []
        for name, t in rollout_weights:
            twin = next((new for old, new in done if old.shape == t.shape and torch.equal(old, t)), None)
            if twin is None:
                noise = torch.randn(t.shape, generator=g).to(t.dtype)
                twin = t + 0.5 * t.float().std().to(t.dtype) * noise if t.numel() > 1 else t
                done.append((t, twin))
            noisy.append((name, twin))
        try:
            rollout_engine.load_weights(bucketize(noisy, 1 << 24))
            after = self.greedy(rollout_engine)
            changed = any(
                a.token_ids != b.token_ids
                or not torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs))
                for a, b in zip(after, before, strict=True)
            )
            assert changed, "load_weights of perturbed weights left every output unchanged"
        finally:
            rollout_engine.load_weights(bucketize(rollout_weights, 1 << 24))
        self.assert_same_greedy(self.greedy(rollout_engine), before)

    def test_unknown_weight_name_raises_and_engine_stays_usable(self, rollout_engine, rollout_weights):
        before = self.greedy(rollout_engine)
        tensor = rollout_weights[0][1]
        bogus = "model.no_such_module.weight"
        with pytest.raises(Exception, match="no_such_module"):
            rollout_engine.load_weights([[(bogus, tensor.clone())]])
        self.assert_same_greedy(self.greedy(rollout_engine), before)

    def test_release_resume_keeps_outputs(self, rollout_engine):
        before = self.greedy(rollout_engine)
        rollout_engine.release(["kv_cache", "weights"])
        rollout_engine.resume(["weights", "kv_cache"])
        self.assert_same_greedy(self.greedy(rollout_engine), before)

    def test_agenerate_matches_generate(self, rollout_engine):
        prompts = self.prompts()
        params = SamplingParams(n=1, temperature=0.0, max_tokens=self.max_tokens)

        async def many():
            return await asyncio.gather(*(rollout_engine.agenerate(p, params) for p in prompts))

        results = asyncio.run(many())
        counts = [len(r) for r in results]
        assert counts == [1] * len(prompts), f"agenerate returned {counts} completions per prompt, n=1"
        self.assert_same_greedy([r[0] for r in results], self.greedy(rollout_engine, prompts))
