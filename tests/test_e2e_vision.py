"""``rlcore train`` on a vision-language model: rows with images go to the rollout with their prompts, and
the rows trained on hold each image's tokens as the model's processor expands them, and the trainer's
log-probs of the sampled responses, with the images, equal the rollout's (the run's ``rollout/`` mismatch
metrics, fp32 on both sides); in every ``trainer.mode``, responses continued across generate calls
(the stream's rounds, async's partial rollouts) included. Tiny Qwen2.5-VL, HF rollout, FSDP, 2 steps."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from rlcore.telemetry.loggers import read_metrics
from rlcore.telemetry.samples import SAMPLES_FILE, read_samples
from rlcore.testing.tiny_vlm import build_tiny_vlm
from rlcore.vision import VisionInputs, image_parts

RLCORE = Path(sys.executable).with_name("rlcore")
#: Both runs: 4 prompts x 2 samples of 8 tokens a step, 2 steps, the HF rollout, no validation set.
RUN = (
    "data.val_files=[]",
    "data.train_batch_size=4",
    "rollout.engine=hf",
    "rollout.n=2",
    "rollout.max_response_length=8",
    "trainer.total_steps=2",
    "trainer.warmup_sft_steps=0",
)
#: fp32 trainer against the fp32 HF rollout with images: measured below 1e-6 (tests/test_vision_rollouts.py).
GAP = 1e-3


def _data(folder, n=8):
    colours = [
        ("red", (255, 0, 0)),
        ("green", (0, 255, 0)),
        ("blue", (0, 0, 255)),
        ("white", (255, 255, 255)),
    ]
    (folder / "img").mkdir(parents=True)
    rows = []
    for i in range(n):
        name, rgb = colours[i % len(colours)]
        buffer = io.BytesIO()
        Image.new("RGB", (28 * (1 + i % 3), 56), rgb).save(buffer, format="PNG")
        (folder / "img" / f"{i}.png").write_bytes(buffer.getvalue())
        rows.append(
            {
                "prompt": [{"role": "user", "content": "<image>Which colour? Answer after ####."}],
                "images": [f"img/{i}.png"],
                "data_source": "openai/gsm8k",
                "reward_model": {"style": "rule", "ground_truth": name},
            }
        )
    path = folder / "colours.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _expanded_mean_length(vision, data, rows, indices):
    """The mean length of rows ``indices``' prompts as the model's own processor expands their images."""
    lengths = []
    for i in indices:
        messages = image_parts(rows[i]["prompt"], 1, "row")
        text = vision.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        image = Image.open(data.parent / rows[i]["images"][0]).convert("RGB")
        lengths.append(len(vision.processor(text=[text], images=[image])["input_ids"][0]))
    return sum(lengths) / len(lengths)


#: The modes; the overlapping ones cut each response into generate calls of 3 tokens (the 8-token
#: responses continue over 2-3 calls, the prompt's images sent with each) and stay on-policy
#: (``max_staleness=0``), so the trainer's log-probs must still equal the rollout's.
MODES = {
    "sync": (),
    "stream": ("trainer.mode=stream", "trainer.rollout_chunk_tokens=3", "trainer.max_staleness=0"),
    "async": (
        "trainer.mode=async",
        "trainer.partial_rollout=true",
        "trainer.rollout_chunk_tokens=3",
        "trainer.max_staleness=0",
    ),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_rlcore_train_carries_images_from_the_data_to_the_rollout_and_the_trainer(
    tmp_path, rlcore_train, mode
):
    model = build_tiny_vlm(tmp_path / "vlm")
    data = _data(tmp_path / "data")
    _, run_dir = rlcore_train(
        tmp_path,
        "vlm",
        f"model.path={model}",
        f"data.train_files=[{data}]",
        *RUN,
        *MODES[mode],
    )
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2]
    # The rows trained on hold each image's tokens as the model's own processor expands them: the step's
    # mean prompt length is that of the processor's inputs for the rows the step drew.
    vision = VisionInputs.for_model(model)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    steps = {s["step"]: s["index"] for s in read_samples(run_dir / SAMPLES_FILE)}
    for r in records:
        assert r["prompt_length/mean"] == _expanded_mean_length(vision, data, rows, steps[r["step"]]), r
        # The trainer's log-probs, with the images, are the rollout's.
        assert r["rollout/logprob_diff_mean"] < GAP and r["rollout/mismatch_k3_kl"] < GAP, r
        assert r["sync/logprob_diff_max"] < GAP if "sync/logprob_diff_max" in r else True
        if mode != "sync":  # responses longer than a call's 3 tokens: they were continued
            assert r["response_length/mean"] > 3, r
        if mode == "stream":
            assert r["stream/rounds"] >= 2, r


def test_the_post_sync_check_sees_a_vision_tower_left_out_of_the_sync(tmp_path):
    """From the second load on the rollout keeps its vision tower's initial weights (``visual.*``): the
    check's probes are the data's first rows, with their images, so the trained sync stops the run. (With
    text probes, the check's old ones, the vision tower never ran in it and this sync passed.)"""
    from rlcore.testing.faults import SKIP_WEIGHTS_ENV

    model = build_tiny_vlm(tmp_path / "vlm")
    data = _data(tmp_path / "data")
    env = {**os.environ, "RLCORE_CACHE_DIR": str(tmp_path / "cache"), SKIP_WEIGHTS_ENV: "visual.:2"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [
            str(RLCORE),
            "train",
            f"trainer.output_dir={tmp_path / 'runs'}",
            "trainer.experiment_name=broken",
            f"model.path={model}",
            f"data.train_files=[{data}]",
            *RUN,
            # The reward is 0 for a random model, so GRPO's advantages are too: the entropy bonus makes the
            # step move the weights, the vision tower's among them.
            "algorithm.entropy_coeff=0.1",
            "actor.optim.lr=1e-2",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert "training stopped at step 1 in phase 'sync_weights': WeightSyncMismatch" in output, output[-3000:]


#: A multi-turn agent run on image prompts: the built-in tool loop with the calculator, two model turns.
AGENT = (
    "agent.enabled=true",
    "agent.tools=[calculator]",
    "agent.max_turns=2",
    "agent.max_tool_response_tokens=16",
    "rollout.max_response_length=96",
    "actor.recompute_old_log_probs=always",  # rollout/ mismatch metrics on every model token
)


@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_agent_episodes_on_image_prompts_train_on_what_the_rollout_read(tmp_path, rlcore_train, mode):
    """Episodes of two model turns around a tool observation (the tiny VLM fitted to answer the prompt
    with a call: tests/test_agent_images.py) on rows with images: every model turn read the image (the
    trainer's log-probs, with the image, equal the rollout's on every model token) and the rows trained
    on hold the prompt as the processor expands it."""
    from rlcore.testing.tiny_vlm import fit_tiny_vlm_answer, solid_image

    prompt, call = "<image>Add the numbers: 2 + 3", "<tool_call>{}</tool_call>"
    model = fit_tiny_vlm_answer(
        build_tiny_vlm(tmp_path / "vlm"), tmp_path / "caller", prompt, solid_image((255, 0, 0)), call
    )
    data = _data(tmp_path / "data")
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows = [{**r, "prompt": [{"role": "user", "content": prompt}]} for r in rows]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for r in rows:  # the image the model was fitted on, in every row's file
        solid_image((255, 0, 0)).save(data.parent / r["images"][0])
    _, run_dir = rlcore_train(
        tmp_path,
        "vlm-agent",
        f"model.path={model}",
        f"data.train_files=[{data}]",
        *RUN,
        *AGENT,
        *(() if mode == "sync" else MODES[mode]),
    )
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2]
    vision = VisionInputs.for_model(model)
    steps = {s["step"]: s["index"] for s in read_samples(run_dir / SAMPLES_FILE)}
    for r in records:
        # Most episodes called the tool and wrote a second turn after its message.
        assert r["agent/turns/mean"] > 1.5 and r["agent/tool_token_fraction"] > 0, r
        assert r["rollout/logprob_diff_mean"] < GAP and r["rollout/mismatch_k3_kl"] < GAP, r
        assert r["prompt_length/mean"] == _expanded_mean_length(vision, data, rows, steps[r["step"]]), r
