"""``SplitGateUpMLP`` (``megatron.split_gate_up``, ``rlcore_megatron/mlp.py``) against megatron-core's dense
``MLP`` and a plain float64 SwiGLU on the full weights: the output and every gradient (input, fused
``linear_fc1``, ``linear_fc2``), eager, compiled as ``megatron.compile`` compiles a layer (CPU inductor),
and compiled under full activation recompute; at TP=2 with sequence parallelism (each
rank's shards as ``rlcore_megatron.convert`` lays them out: ``[gate_r; up_r]``).

Not a speed test: what it pins is that the two GEMMs on the weight's halves give megatron-core's numbers,
so a wrong half (gate for up), a lost or doubled weight gradient, or a missing input-gradient sum over the
tensor-parallel ranks fails here.
"""

from __future__ import annotations

import mcore_mlp_workers
import pytest
import torch
from mcore_testlib import spawn

pytestmark = pytest.mark.distributed

#: TP=2 with sequence parallelism only: TP=1 and TP=2 run in the model-level tests (test_architectures'
#: qwen3 and tp2_qwen3 against float64 HF; test_packing's compiled TP=1 layers with no graph break), and the
#: suite keeps under 45 minutes.
LAYOUTS = {"tp2_sp": (2, True)}
VARIANTS = ("megatron", "split", "split_compiled", "split_compiled_recompute")
NAMES = ("out", "input grad", "linear_fc1 grad", "linear_fc2 grad")
#: How dynamo names the CPU redirect's ``torch.cuda.current_device`` in a graph break's reason.
REDIRECT = "install.<locals>.<lambda>"


@pytest.fixture(scope="module", params=list(LAYOUTS), ids=list(LAYOUTS))
def ranks(request, tmp_path_factory):
    world, sequence_parallel = LAYOUTS[request.param]
    work = tmp_path_factory.mktemp(f"mlp_{request.param}")
    spawn(mcore_mlp_workers.mlp, world, sequence_parallel, str(work))
    return [torch.load(work / f"mlp_rank{r}.pt", weights_only=False) for r in range(world)]


def test_split_gate_up_equals_megatron_and_float64_reference(ranks):
    """Every variant on every rank; recompute is left out under sequence parallelism only
    (``mcore_mlp_workers.mlp`` says why)."""
    for rank in ranks:
        variants = [v for v in VARIANTS if v in rank]
        assert len(variants) == len(VARIANTS) - rank["layout"].endswith("_sp")
        for variant in variants:
            for name, got, megatron, reference in zip(
                NAMES, rank[variant], rank["megatron"], rank["reference"], strict=True
            ):
                # Float64 throughout: only summation orders differ (dgrad as two GEMMs of width F/tp).
                msg = f"{rank['layout']} {variant}: {name}"
                torch.testing.assert_close(got, megatron, rtol=1e-10, atol=1e-10, msg=msg)
                torch.testing.assert_close(got, reference, rtol=1e-10, atol=1e-10, msg=msg)


def test_compiled_split_mlp_has_no_graph_breaks(ranks):
    """The two GEMMs' autograd function (with its collectives under tensor and sequence parallelism) is
    traced into the compiled graph, forward and backward. Under sequence parallelism megatron-core's
    ``linear_fc2`` allocates its reduce-scatter output on ``torch.cuda.current_device()``, here the CPU
    redirect's stand-in (``mcore_cpu_redirect.install``), which dynamo cannot put in a graph; those breaks
    only are allowed (a GPU's ``current_device`` is traced)."""
    for rank in ranks:
        assert rank["split_compiled_runs"]
        breaks = rank["graph_breaks"]
        if rank["layout"].endswith("_sp"):
            breaks = {reason: n for reason, n in breaks.items() if REDIRECT not in reason}
        assert breaks == {}
