"""docs/agents.md's "Trying a tool without a model that calls it" snippet runs as printed and prints what
its comment says."""

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "agents.md"


def test_the_snippet_runs_the_calculator_as_an_episode_would():
    text = DOC.read_text()
    section = text[text.index("### Trying a tool without a model that calls it") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {})
    assert out.getvalue().split() == ["13854"]
