"""MATH rule reward: the last ``\\boxed{...}`` answer against the reference, after the string
normalisation of Hendrycks et al. as used by lm-evaluation-harness and verl's ``math_reward``.

Normalisation drops spaces, ``\\left``/``\\right``, degree marks, ``\\$``, ``\\%``, trailing ``\\text{ unit}``,
a short ``x =`` prefix, and rewrites ``\\dfrac``/``\\tfrac`` to ``\\frac``, ``\\frac12`` to ``\\frac{1}{2}``,
``a/b`` (integers) to ``\\frac{a}{b}``, ``\\sqrt2`` to ``\\sqrt{2}``, ``0.5`` to ``\\frac{1}{2}`` and ``.5``
to ``0.5``. One deliberate difference from verl: an ``\\fbox{...}`` answer is read (verl finds it, then
fails to unwrap it and scores 0).

>>> compute_score("lighteval/MATH", "so $x = \\\\boxed{\\\\dfrac{1}{2}}$", "\\\\frac12")
1.0
"""

from __future__ import annotations

from typing import Any


def last_boxed(text: str) -> str | None:
    """The last ``\\boxed{...}`` (braces balanced) or ``\\boxed x`` in ``text``, including the command."""
    # A space-separated ``\boxed 5`` runs to the next ``$``; verl gives it precedence, so do we.
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def unbox(boxed: str) -> str | None:
    """The content of ``\\boxed{...}``, ``\\fbox{...}`` or ``\\boxed x``; ``None`` if malformed."""
    if boxed.startswith("\\boxed "):
        return boxed[len("\\boxed ") :]
    for command in ("\\boxed{", "\\fbox{"):
        if boxed.startswith(command) and boxed.endswith("}"):
            return boxed[len(command) : -1]
    return None


def normalize(answer: str) -> str:
    """Canonical form of a LaTeX answer; raises ``ValueError`` on input the rules cannot parse."""
    s = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    s = _drop_units(s)
    s = s.replace("\\\\%", "").replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    parts = s.split("=")
    if len(parts) == 2 and len(parts[0]) <= 2:  # "x = 5", "k=3"
        s = parts[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def is_equiv(a: str | None, b: str | None) -> bool:
    """Equal after :func:`normalize` (as raw strings when either cannot be normalised)."""
    if a is None or b is None:
        return a is None and b is None
    try:
        return normalize(a) == normalize(b)
    except ValueError:
        return a == b


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    """1.0 if the last boxed answer of ``solution_str`` matches ``ground_truth``, else 0.0."""
    boxed = last_boxed(solution_str)
    answer = unbox(boxed) if boxed is not None else None
    if answer is None:
        return 0.0
    return 1.0 if is_equiv(answer, str(ground_truth)) else 0.0


def _drop_units(s: str) -> str:
    # "\text{ " (with the space) only ever introduces a unit in MATH answers.
    if "\\text{ " not in s:
        return s
    parts = s.split("\\text{ ")
    if len(parts) != 2:
        raise ValueError(f"more than one unit in {s!r}")
    return parts[0]


def _fix_sqrt(s: str) -> str:
    if "\\sqrt" not in s:
        return s
    head, *rest = s.split("\\sqrt")
    out = head
    for part in rest:
        if not part:
            raise ValueError(f"\\sqrt without an argument in {s!r}")
        out += "\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:])
    return out


def _fix_fracs(s: str) -> str:
    head, *rest = s.split("\\frac")
    out = head
    for part in rest:
        out += "\\frac"
        if not part:
            raise ValueError(f"\\frac without arguments in {s!r}")
        if part[0] == "{":
            out += part
            continue
        if len(part) < 2:
            return s  # "\frac1": nothing sensible to rewrite
        a, b, tail = part[0], part[1], part[2:]
        out += "{" + a + "}{" + b + "}" + tail if b != "{" else "{" + a + "}" + b + tail
    return out


def _fix_a_slash_b(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s
