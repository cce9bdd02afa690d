"""The built-in visual task ``count_shapes``: an image of one to four shapes, "How many shapes?" -> the
digit.

Each image is 56 x 56 pixels on white, split into four 28 x 28 cells; ``k`` of the cells (``k`` from 1 to
4, each equally often) hold one shape each: a square, a disc or a triangle of 12-22 pixels in one of
:data:`COLOURS`, placed anywhere inside its cell. The prompt is one image and the question; the reward is
1 when the response, stripped of white space, is the digit ``k``, else 0, so the validation reward
(greedy, every held-out image once) reads as accuracy, and a policy that ignores the image scores 1/4.

Why this shape: the tiny VLM (:func:`rlcore.testing.tiny_vlm.build_tiny_vlm`, Qwen2.5-VL: patches of 14
pixels merged 2 x 2) reads a 56-pixel image as four image tokens, one per cell, so counting is adding up
which of four tokens show a shape: learnable by a 2-layer model from random weights, yet only through
the image. The images are drawn with Pillow from a seed per split, so the files are the same on every
machine; train and held-out images come from different seeds.

As for ``copy_word``, a random model never writes a digit and end-of-sequence, so the recipe starts
with a short supervised warm-up on the training rows: it teaches the answer's form and leaves the
held-out accuracy near chance, and RL then teaches the counting.

>>> compute_score("rlcore/count_shapes", " 3", "3")
1.0
>>> [len(r["images"]) for r in rows("val")[:2]]
[1, 1]
"""

from __future__ import annotations

import random
from typing import Any

#: The data source naming this task's reward function (``register_reward_functions``).
DATA_SOURCE = "rlcore/count_shapes"

#: The files this task provides (``builtin:count_shapes/<split>.jsonl``), and how many images each has.
SPLITS = ("train", "val", "sft")
SIZES = {"train": 512, "val": 128, "sft": 512}
#: The seed of each split's images (``sft`` is the training set with its answers).
SEEDS = {"train": 0, "val": 1, "sft": 0}

IMAGE_SIZE = 56
CELL = IMAGE_SIZE // 2
COLOURS = ((220, 40, 40), (40, 160, 60), (40, 80, 220), (230, 170, 20), (150, 60, 180))
SHAPES = ("square", "disc", "triangle")
QUESTION = "How many shapes?"


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> float:
    """1.0 when ``solution_str`` is the count ``ground_truth`` after stripping white space, else 0.0."""
    return 1.0 if solution_str.strip() == str(ground_truth) else 0.0


def scenes(split: str) -> list[list[tuple[int, str, tuple[int, int, int], int, int, int]]]:
    """Each image of ``split`` as its shapes: ``(cell, shape, colour, size, x, y)``, the top-left corner
    ``(x, y)`` in pixels. Image ``i`` holds ``i % 4 + 1`` shapes, so every count is equally common."""
    rng = random.Random(SEEDS[split])
    out = []
    for i in range(SIZES[split]):
        cells = rng.sample(range(4), i % 4 + 1)
        shapes = []
        for cell in sorted(cells):
            size = rng.randint(12, 22)
            x = (cell % 2) * CELL + rng.randint(1, CELL - size - 1)
            y = (cell // 2) * CELL + rng.randint(1, CELL - size - 1)
            shapes.append((cell, rng.choice(SHAPES), rng.choice(COLOURS), size, x, y))
        out.append(shapes)
    return out


def draw(shapes: list[tuple[int, str, tuple[int, int, int], int, int, int]]) -> Any:
    """The RGB ``PIL.Image`` of one scene."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    for _, shape, colour, size, x, y in shapes:
        box = (x, y, x + size, y + size)
        if shape == "square":
            pen.rectangle(box, fill=colour)
        elif shape == "disc":
            pen.ellipse(box, fill=colour)
        else:
            pen.polygon([(x + size / 2, y), (x, y + size), (x + size, y + size)], fill=colour)
    return image


def image_name(split: str, index: int) -> str:
    """An image's path, relative to the split's file."""
    return f"images/{SEEDS[split]}-{index:04d}.png"


def images(split: str) -> list[tuple[str, Any]]:
    """``(relative path, PIL.Image)`` of every image the rows of ``split`` name (written beside its file)."""
    return [(image_name(split, i), draw(s)) for i, s in enumerate(scenes(split))]


def rows(split: str) -> list[dict[str, Any]]:
    """The rows of ``split``: one image each (``images``, a path beside the file), the question with its
    ``<image>`` place, the count as ground truth; ``sft`` rows carry it as ``response`` too."""
    if split not in SPLITS:
        raise ValueError(f"task 'count_shapes' has no split {split!r}; its splits are {', '.join(SPLITS)}")
    out = []
    for index, shapes in enumerate(scenes(split)):
        row: dict[str, Any] = {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"<image>{QUESTION}"}],
            "images": [image_name(split, index)],
            "reward_model": {"style": "rule", "ground_truth": str(len(shapes))},
            "extra_info": {"split": split, "index": index},
        }
        if split == "sft":
            row["response"] = str(len(shapes))
        out.append(row)
    return out


#: Settings under the user's when a run trains on this task (``docs/vision.md``, the recipe).
RECIPE: dict[str, Any] = {
    "model": {"path": "builtin:tiny-vlm"},
    "algorithm": {"name": "grpo", "use_kl_loss": False},
    "actor": {"optim": {"lr": 5e-4}},
    "rollout": {"n": 8, "temperature": 1.0, "max_response_length": 4},
    "data": {"train_batch_size": 32, "max_prompt_length": 32},
    "reward": {"num_workers": 0},
    "trainer": {"total_steps": 80, "warmup_sft_steps": 20, "val_freq": 20},
}
