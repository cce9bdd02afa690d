"""A broken engine run through the contract suites shows what was expected and what it got.

The suites run in a separate pytest process laid out as a third-party plugin's tests: rlcore installed
(as here: editable), a conftest importing :mod:`rlcore.testing.contract`. A separate process, because
whether the module is rewritten depends on what imported it first, and this process imported it long ago.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

CONFTEST = '''
import pytest
from rlcore.api import EngineSpec, RolloutSpec
from rlcore.testing.contract import RolloutEngineContract, TrainEngineContract
from rlcore.testing.fakes import FakeRollout, FakeRolloutConfig, FakeTrainConfig, FakeTrainEngine

LOG_PROB_SHIFT = 0.25


class OffLogProbsEngine(FakeTrainEngine):
    """infer's log-probs are LOG_PROB_SHIFT lower than those train_step's loss is computed from."""

    def infer(self, batch, outputs=("log_probs",)):
        out = super().infer(batch, outputs)
        if "log_probs" in out.tensors:
            out.tensors["log_probs"] = out.tensors["log_probs"] - LOG_PROB_SHIFT * batch["response_mask"]
        return out


class OneShortRollout(FakeRollout):
    """Returns one completion fewer than n per prompt."""

    def generate(self, prompts, params):
        return [completions[:-1] for completions in super().generate(prompts, params)]


class BrokenTrain(TrainEngineContract):
    vocab_high = 256

    @pytest.fixture
    def make_train_engine(self):
        def make(**spec_overrides):
            spec = EngineSpec(model_path="", **spec_overrides)
            return OffLogProbsEngine(spec, FakeTrainConfig(vocab_size=256))

        return make


class BrokenRollout(RolloutEngineContract):
    vocab_high = 256

    @pytest.fixture
    def rollout_engine(self):
        return OneShortRollout(RolloutSpec(model_path=""), FakeRolloutConfig(vocab_size=256))
'''

TESTS = """
from conftest import BrokenRollout, BrokenTrain


class TestOffLogProbs(BrokenTrain):
    pass


class TestOneShortRollout(BrokenRollout):
    pass
"""


@pytest.mark.parametrize("autoload", [True, False], ids=["entry-point", "no-plugin-autoload"])
def test_broken_engine_failures_show_expected_and_got(tmp_path, autoload):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # no ini of an enclosing folder applies
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_broken_engine.py").write_text(textwrap.dedent(TESTS))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["OMP_NUM_THREADS"] = "1"  # tiny ops; threads only cost time on a shared machine
    if not autoload:
        # rlcore's pytest11 entry point is not loaded: the conftest's import alone must register rewriting.
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    only = "test_train_step_decreases_loss or test_generate_shapes_and_log_probs"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", "-k", only],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1 and "2 failed" in out, f"expected 2 failures, exit {run.returncode}:\n{out}"
    assert not re.search(r"^E\s+AssertionError\s*$", out, re.M), f"a bare AssertionError:\n{out}"
    assert "PytestAssertRewriteWarning" not in out, out

    # The contract's message: both numbers, which differ by exactly the engine's error.
    found = re.search(r"first train_step loss (\S+) != NLL of infer's log-probs (\S+) ", out)
    assert found, f"no expected-vs-got message for the off log-probs:\n{out}"
    loss, nll = float(found[1]), float(found[2])
    assert nll - loss == pytest.approx(0.25, abs=1e-4), out
    # pytest's own explanation, present only if rlcore.testing.contract was rewritten.
    assert f"Obtained: {found[1]}" in out and f"Expected: {found[2]} ± " in out, out

    assert "generate returned 2 completions for n=3" in out, out
    assert re.search(r"^E\s+assert 2 == 3$", out, re.M), f"contract.py was not rewritten:\n{out}"
