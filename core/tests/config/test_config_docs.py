"""docs/config.md is generated from the attrs config classes; these tests keep it in sync and complete."""

from __future__ import annotations

import difflib
import importlib.metadata as md
import tomllib
from pathlib import Path

import attrs
import pytest
from rlcore.config import docs

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "config.md"


def repo_plugin_distributions() -> list[str]:
    """Distribution names of the engine plugins in this repository (plugins/*/pyproject.toml)."""
    names = []
    for pyproject in sorted((ROOT / "plugins").glob("*/pyproject.toml")):
        names.append(tomllib.loads(pyproject.read_text())["project"]["name"])
    return names


def documented_distributions() -> list[str]:
    """rlcore plus the repository's plugins; skips when one of those is not installed, since its
    section could then not be generated here."""
    missing = []
    for name in repo_plugin_distributions():
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            missing.append(name)
    if missing:
        pytest.skip(f"plugins of this repository not installed here (make setup installs them): {missing}")
    return ["rlcore", *repo_plugin_distributions()]


def test_config_md_is_up_to_date():
    only = documented_distributions()
    text, _ = docs.generate(only)
    current = DOC.read_text() if DOC.is_file() else ""
    if current != text:
        installed = docs.distributions_of(docs.plugin_sections())
        command = docs.COMMAND
        if sorted(installed) != sorted(only):  # other plugins installed here: leave them out
            command += " --only " + " ".join(only)
        diff = difflib.unified_diff(
            current.splitlines(True), text.splitlines(True), "docs/config.md", "generated"
        )
        shown = "".join(list(diff)[:60])
        pytest.fail(
            f"docs/config.md is out of date. Regenerate it from the repository root with:\n  {command}\n\n{shown}"
        )


def test_every_config_field_has_a_doc_comment():
    _, missing = docs.generate(documented_distributions())
    assert missing == [], f"config fields without a `#:` doc comment (add one above each field): {missing}"


def test_every_core_field_is_in_the_reference():
    """Independent of the generator: every leaf key of RLConfig, found through attrs' resolved types."""
    from rlcore.config.schema import RLConfig

    def keys(cls: type, prefix: str) -> list[str]:
        attrs.resolve_types(cls)
        out = []
        for field in attrs.fields(cls):
            if cls is RLConfig and field.name == "plugins":
                continue
            if isinstance(field.type, type) and attrs.has(field.type):
                out += keys(field.type, f"{prefix}{field.name}.")
            else:
                out.append(f"{prefix}{field.name}")
        return out

    text = DOC.read_text()
    found = keys(RLConfig, "")
    assert "actor.optim.lr" in found and "trainer.total_steps" in found
    for key in found:
        assert f"| `{key}` |" in text, f"{key} missing from docs/config.md"


# -- the generator on classes of its own ----------------------------------------------------------
@attrs.define
class Inner:
    """Inner settings.

    More words that stay out of the reference."""

    #: Size of things.
    size: int = 3


@attrs.define
class Bare:
    #: Documented, but the section itself is described nowhere.
    flag: bool = False


@attrs.define
class Base:
    #: Base doc that the subclass replaces.
    rate: float = 0.5
    #: A name.
    name: str = "x"


@attrs.define
class Child(Base):
    """A child section."""

    #: The child's own words
    #: over two lines.
    rate: float = 1e-6
    #: Inner section, with a non-default size.
    inner: Inner = attrs.Factory(lambda: Inner(size=7))
    loose: list[str] | None = None
    #: Tags.
    tags: tuple[str, ...] = ("a", "b")
    bare: Bare = attrs.Factory(Bare)


def test_comment_docs_reads_hash_colon_blocks_and_inheritance():
    found = docs.comment_docs(Child)
    assert found["rate"] == ("float", "The child's own words over two lines.")
    assert found["name"] == ("str", "A name.")  # from the base class
    assert found["loose"] == ("list[str] | None", "")
    assert found["inner"][0] == "Inner"


def test_walk_takes_defaults_from_the_parent_and_flags_undocumented_fields():
    sections = docs.walk(Child, "child")
    assert [s.key for s in sections] == ["child", "child.inner", "child.bare"]
    rows = {f.key: f for f in sections[0].fields}
    assert rows["child.rate"].default == "1.0e-6"
    assert rows["child.tags"].default == "[a, b]"
    assert rows["child.loose"].default == "null"
    inner = sections[1]
    assert inner.fields[0].default == "7"  # the parent's default instance, not Inner()'s 3
    assert inner.description == "Inner section, with a non-default size. Inner settings."
    assert docs.undocumented(sections) == ["child.bare", "child.loose"]


def test_render_value():
    assert [docs.render_value(v) for v in (None, True, False, 0.001, 1e-8, 2.5, 268435456, "", "auto")] == [
        "null",
        "true",
        "false",
        "0.001",
        "1.0e-8",
        "2.5",
        "268435456",
        '""',
        "auto",
    ]
    assert docs.render_value({"a": [1, None]}) == "{a: [1, null]}"
    assert [docs.render_value(v) for v in (2.5e-7, 1e20, 1.5e300)] == ["2.5e-7", "1.0e+20", "1.5e+300"]


def test_rendered_floats_load_as_floats_in_yaml():
    import yaml

    for value in (1e-6, 2.5e-7, 1e20, 0.001, 1.0, 268435456.0):
        assert yaml.safe_load(f"x: {docs.render_value(value)}")["x"] == value


def test_table_cells_escape_pipes_and_rst_markup():
    section = docs.walk(Child, "child")[0]
    text = docs.render([section], [])
    assert "| `child.loose` | `list[str] \\| None` | `null` |  |" in text


def test_check_mode_reports_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "config.md"
    stale.write_text("# old\n")
    only = ["rlcore"]
    assert docs.main(["--output", str(stale), "--check", "--only", *only]) == 1
    assert "out of date" in capsys.readouterr().err
    assert docs.main(["--output", str(stale), "--only", *only]) == 0
    assert docs.main(["--output", str(stale), "--check", "--only", *only]) == 0
    assert "### `fsdp`" not in stale.read_text()  # --only left the plugin out
    assert "### `hf`" in stale.read_text()  # built-in sections count as rlcore's
