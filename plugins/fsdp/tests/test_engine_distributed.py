"""Two gloo ranks (torch.multiprocessing) against one process: data parallelism changes nothing.

One spawn runs every variant (padded, packed with token-budget micro-batches and kept logits, CPU
offload) and a checkpoint round trip on 2 ranks (``fsdp_dist_worker.py``); the reference is the same
engine on one process with the whole batch, and for log-probs a plain HF model in float64.
"""

import pytest
import torch
import torch.multiprocessing as mp
from fsdp_dist_worker import run
from fsdp_support import STEPS, VARIANTS, batch, free_port, full_weights, hf_reference, nll_entropy_loss, spec
from rlcore.api import DistInfo
from rlcore.devices import get_platform
from rlcore_fsdp.config import FSDPConfig
from rlcore_fsdp.engine import FSDPEngine

WORLD = 2


@pytest.fixture(scope="module")
def ranks(tiny_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp-2ranks")
    mp.spawn(run, args=(WORLD, free_port(), str(tiny_model_path), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)], out


@pytest.fixture(scope="module")
def references(tiny_model_path):
    """The padded engine on one process, trained on the whole batch, in float64 and float32."""
    out = {}
    for dtype in ("float64", "float32"):
        engine = FSDPEngine(
            spec(str(tiny_model_path), dtype=dtype), FSDPConfig(), get_platform("cpu"), DistInfo()
        )
        metrics = [engine.train_step(batch(), nll_entropy_loss) for _ in range(STEPS)]
        infer = engine.infer(batch(), ["log_probs", "entropy"])
        out[dtype] = {"metrics": metrics, "weights": full_weights(engine), "infer": infer}
    return out


#: (loss atol, grad-norm rtol, weight atol) per precision. float32 weights get 1e-4: AdamW divides each
#: update by the gradient's own running magnitude, so elements whose gradient is near zero (the k_proj
#: bias's is exactly zero: a constant added to all of a query's scores does not change its softmax) are
#: moved by rounding noise, up to a few 1e-5 here after three steps; every other element agrees to 1e-5.
TOLERANCE = {"float64": (1e-9, 1e-9, 1e-9), "float32": (1e-5, 1e-4, 1e-4)}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_two_ranks_equal_one_process(ranks, references, variant):
    results, _ = ranks
    dtype = "float32" if variant == "fp32" else "float64"
    reference, (atol, grad_rtol, weight_atol) = references[dtype], TOLERANCE[dtype]
    assert [r["rows"] for r in results] == [4, 3]
    for step in range(STEPS):
        got, want = results[0][variant]["metrics"][step], reference["metrics"][step]
        assert set(got) == set(want) == {"loss", "grad_norm", "lr", "entropy"}
        assert results[1][variant]["metrics"][step] == got, "metrics must be identical on every rank"
        assert got["loss"] == pytest.approx(want["loss"], rel=0, abs=atol)
        # AdamW hides a gradient scale error (averaging instead of summing); the pre-clip norm does not.
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=grad_rtol)
        assert got["lr"] == want["lr"]
    weights = results[0][variant]["weights"]
    assert sorted(weights) == sorted(reference["weights"])
    for name, tensor in reference["weights"].items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=weight_atol, msg=f"{variant}: {name}")
    mask = batch()["attention_mask"][:, -batch()["responses"].shape[1] :].bool()
    for field in ("log_probs", "entropy"):
        got = torch.cat([r[variant]["infer"][field] for r in results])
        torch.testing.assert_close(got[mask], reference["infer"][field][mask], rtol=0, atol=10 * atol)
        assert (got[~mask] == 0).all()


def test_weights_moved_and_float64_variants_agree(ranks, tiny_model_path):
    from safetensors.torch import load_file

    results, _ = ranks
    start = load_file(str(tiny_model_path / "model.safetensors"))
    padded = results[0]["padded"]["weights"]
    moved = max(float((padded[n] - start[n].double()).abs().max()) for n in start)
    assert moved > 1e-3, "training did not move the weights"
    for variant in ("packed", "offload", "reduce-once"):
        for name, tensor in padded.items():
            torch.testing.assert_close(results[0][variant]["weights"][name], tensor, rtol=0, atol=1e-9)


def test_checkpoint_resume_is_bit_for_bit(ranks):
    results, out = ranks
    assert results[0]["resume_step"] == 3
    continued, resumed = results[0]["continued"], results[0]["resumed"]
    assert sorted(continued) == sorted(resumed)
    for name in continued:
        assert torch.equal(continued[name], resumed[name]), (
            f"{name} differs after resuming from the checkpoint"
        )
    assert (out / "ckpt" / ".metadata").is_file()
    assert not (out / "ckpt.tmp").exists(), "the temporary checkpoint folder was not renamed"


def test_hf_export_from_two_ranks_loads_in_transformers(ranks):
    from transformers import AutoModelForCausalLM

    results, out = ranks
    model = AutoModelForCausalLM.from_pretrained(out / "hf", dtype=torch.float64)
    want, _ = hf_reference(model, batch(), temperature=spec("").temperature)
    got = torch.cat([r["hf_infer"]["log_probs"] for r in results]).double()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert (out / "hf" / "tokenizer.json").is_file()


def test_close_destroys_only_an_owned_process_group(ranks):
    results, _ = ranks
    for r in results:
        assert r["closed_by_non_owner"] is False
        assert r["closed"] is True
