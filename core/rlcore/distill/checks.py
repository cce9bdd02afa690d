"""Start-up checks of the ``teacher:`` section: a causal LM folder, an engine with the ``lm`` head, and
the student's tokenizer.

They read files only (``config.json``, the tokenizers), so ``rlcore train`` runs the folder and engine
checks before anything starts (:mod:`rlcore.trainer.preflight`), and the trainer runs them all, the
tokenizer comparison included, once the student's tokenizer is loaded and before any engine starts.

Why the tokenizer must match exactly: the teacher scores the student's token ids as they are (no decoding
and re-encoding), so id ``k`` must be the same token for both. A teacher of another vocabulary would need
a token alignment between the two tokenizations (GOLD, ULD), which rlcore does not implement; such a
teacher is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlcore.distill.config import ROLE, teacher_engine, tokenizer_folder

#: Differing ids named in the tokenizer message.
SHOWN_DIFFERENCES = 3


def teacher_problems(config: Any, student_tokenizer: Any = None) -> list[str]:
    """What is wrong with the ``teacher:`` section of ``config`` for a run whose algorithm distils, one
    ``'key': message`` line each (empty when fine). With ``student_tokenizer`` (the policy's), also
    whether the teacher's tokenizer is the same."""
    teacher = config.teacher
    if not teacher.model_path:
        return [
            f"'teacher.model_path': algorithm.name={config.algorithm.name} distils from a teacher; set "
            "teacher.model_path to a Hugging Face folder of a causal LM with the student's tokenizer (or a "
            "built-in model such as builtin:tiny)"
        ]
    from rlcore.models import builtin_name

    problems = []
    name = builtin_name(teacher.model_path)
    if name is not None:  # built when the run starts; here only whether it can be
        from rlcore.models import missing_requirement

        problem = missing_requirement(name)
    else:
        problem = _model_folder_problem(Path(teacher.model_path).expanduser())
    if problem:
        problems.append(f"'teacher.model_path': {problem}")
    problem = _engine_problem(config)
    if problem:
        problems.append(problem)
    if not problems and student_tokenizer is not None:
        problem = _tokenizer_problem(config, student_tokenizer)
        if problem:
            problems.append(problem)
    return problems


def unused_teacher_problem(config: Any, roles: tuple[str, ...]) -> str | None:
    """A ``teacher:`` model named for an algorithm that has no teacher role (``roles``: the algorithm
    class's): the user meant to distil, and the run would silently not."""
    if config.teacher.model_path and ROLE not in roles:
        return (
            f"'teacher.model_path': set to {config.teacher.model_path!r}, but algorithm.name="
            f"{config.algorithm.name} uses no teacher; set algorithm.name=opd to distil from it, or unset "
            "teacher.model_path"
        )
    return None


def _model_folder_problem(folder: Path) -> str | None:
    from rlcore.models.folders import architecture_problem, read_hf_config

    hf_config, problem = read_hf_config(
        folder,
        "a local Hugging Face folder of a causal LM (engines do not download), or a built-in model "
        "(builtin:tiny, builtin:smollm2-135m-instruct)",
    )
    if problem:
        return problem
    return architecture_problem(
        folder,
        hf_config,
        "ForCausalLM",
        "language model: a teacher gives a log-prob to every token of the student's responses, which takes "
        "an LM head",
    )


def _engine_problem(config: Any) -> str | None:
    """The engine must implement the ``lm`` head (engines declare theirs in ``TrainEngine.heads``)."""
    from rlcore.plugins import registry
    from rlcore.plugins.registries import RegistryError

    name = teacher_engine(config)
    key = "teacher.engine" if config.teacher.engine else "engine"
    try:
        entry = registry("train_engines").entry(name)
        engine_cls = entry.load()
    except RegistryError as exc:
        return f"'{key}': {exc}"
    heads = getattr(engine_cls, "heads", None)
    if heads is not None and "lm" not in heads:
        return (
            f"'{key}': train engine {name!r} (plugin {entry.plugin}) has no 'lm' head (it declares "
            f"{', '.join(heads)}), which the teacher's log-probs need; set teacher.engine to one that has"
        )
    return None


def _tokenizer_problem(config: Any, student: Any) -> str | None:
    teacher = config.teacher
    key = "teacher.tokenizer_path" if teacher.tokenizer_path else "teacher.model_path"
    folder = tokenizer_folder(teacher)
    try:
        from transformers import AutoTokenizer

        theirs = AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:
        return f"'{key}': no tokenizer could be loaded from {str(folder)!r} ({type(exc).__name__}: {exc})"
    difference = vocabulary_difference(student.get_vocab(), theirs.get_vocab())
    if difference:
        return (
            f"'{key}': the teacher's tokenizer ({str(folder)!r}) is not the student's: {difference}. The teacher "
            "scores the student's token ids as they are, so both need one vocabulary; a teacher of another "
            "tokenizer needs a token alignment, which rlcore does not implement. Use a teacher of the student's "
            "tokenizer family, or distil into a student of the teacher's tokenizer"
        )
    size = _vocab_size(Path(teacher.model_path).expanduser())
    largest = max(student.get_vocab().values(), default=-1)
    if size is not None and largest >= size:
        return (
            f"'teacher.model_path': the teacher's embedding has {size} rows (config.json vocab_size), but the "
            f"student's tokenizer has ids up to {largest}; the teacher cannot score those tokens"
        )
    return None


def vocabulary_difference(student: dict[str, int], teacher: dict[str, int]) -> str | None:
    """``None`` when both vocabularies (token -> id) are the same; else what differs, in words: sizes
    and the first ids that name different tokens."""
    if student == teacher:
        return None
    by_id_s = {i: t for t, i in student.items()}
    by_id_t = {i: t for t, i in teacher.items()}
    ids = sorted(set(by_id_s) | set(by_id_t))
    differing = [i for i in ids if by_id_s.get(i) != by_id_t.get(i)]
    shown = ", ".join(
        f"id {i} is {by_id_s.get(i)!r} for the student, {by_id_t.get(i)!r} for the teacher"
        for i in differing[:SHOWN_DIFFERENCES]
    )
    return (
        f"{len(student)} tokens against {len(teacher)}, {len(differing)} ids differ ({shown}"
        f"{', ...' if len(differing) > SHOWN_DIFFERENCES else ''})"
    )


def _vocab_size(folder: Path) -> int | None:
    try:
        hf_config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    size = hf_config.get("vocab_size", (hf_config.get("text_config") or {}).get("vocab_size"))
    return int(size) if isinstance(size, int) else None
