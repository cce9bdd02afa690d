"""End to end: the demo with its rollout in a Python environment of its own (rlcore.envs), whose
transformers (5.12.1, SGLang's pin) is not the trainer's (the constraints' 5.19).

``rlcore env build`` makes the environment with the real pip from the registry: an **overlay** venv over
the driver's ``site-packages`` (torch, Ray and rlcore shared), not a full environment, which would
download torch again for every CI run. The run's FSDP actor stays in the driver's environment, the HF
rollout's Ray worker starts with the overlay's interpreter; ``RLCORE_WIRE_AUDIT=1`` checks that every value
crossing between the roles' processes is made of core types (rlcore.cluster.neutral), and the post-sync
check compares the rollout's log-probs (transformers 5.12.1) with the trainer's (5.19) at every sync.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
from rlcore.telemetry.loggers import read_metrics

pytestmark = pytest.mark.slow

RLCORE = str(Path(sys.executable).with_name("rlcore"))
OLD = "5.12.1"
DEFINE = f"environments.requirements.old-hf=[transformers=={OLD}]"
STEPS = 20


@pytest.fixture(scope="module")
def env_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("envs")
    env = {**os.environ, "RLCORE_ENV_HOME": str(home)}
    done = subprocess.run(
        [RLCORE, "env", "build", "old-hf", DEFINE], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rlcore env: old-hf ready in" in done.stderr
    return home


def test_the_environment_has_its_own_transformers_and_the_drivers_rest(env_home):
    assert transformers.__version__ != OLD  # the premise: the trainer's environment has another one
    (path,) = env_home.glob("old-hf-*")
    python = path / "bin" / "python"
    script = "import json, transformers, torch, ray, rlcore; print(json.dumps([transformers.__version__, torch.__file__, ray.__version__]))"
    version, torch_file, ray_version = json.loads(
        subprocess.run([str(python), "-c", script], capture_output=True, text=True, check=True).stdout
    )
    import ray
    import torch

    assert version == OLD and torch_file == torch.__file__ and ray_version == ray.__version__
    marker = json.loads((path / "rlcore-env.json").read_text())
    assert marker["requirements"] == [f"transformers=={OLD}"] and marker["versions"]["transformers"] == OLD


def test_the_demo_trains_with_its_rollout_in_another_transformers(env_home, tmp_path, train_env):
    env = {**train_env(tmp_path), "RLCORE_ENV_HOME": str(env_home), "RLCORE_WIRE_AUDIT": "1"}
    args = [RLCORE, "train", DEFINE, "environments.roles.rollout=old-hf", f"trainer.total_steps={STEPS}"]
    args += [f"trainer.output_dir={tmp_path / 'runs'}", "trainer.experiment_name=envs"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    run_dir = tmp_path / "runs" / "envs"
    driver = (run_dir / "logs" / "driver.log").read_text()
    (path,) = env_home.glob("old-hf-*")
    assert f"rlcore: rollout: workers run in environment old-hf ({path}, transformers {OLD})" in driver
    assert (
        "trainer.placement auto -> colocated (the rollout runs in another environment than the actor"
        in driver
    )
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    first, end = records[0], records[-1]["val/reward"]
    # The default run's bar (tests/test_e2e_train.py): it learns the task past its SFT warm-up.
    assert end >= first["val/reward_after_sft"] + 0.35, [r.get("val/reward") for r in records]
    # The post-sync check held at every check, trainer (5.19) and rollout (5.12.1) on the same weights.
    checked = [r for r in records if "sync/logprob_diff_mean" in r]
    assert [r["step"] for r in checked] == [0, 1, 10, 20]
    assert all(r["sync/logprob_diff_mean"] < 1e-3 for r in checked), [
        r["sync/logprob_diff_mean"] for r in checked
    ]
