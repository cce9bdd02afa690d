"""The config reference (``docs/config.md``), generated from the attrs classes of the config.

Each field is documented by the ``#:`` comment lines right above it in its class's source; its type is
the annotation as written there, and its default is read from a default-constructed section (so
``critic.optim.lr`` shows the critic's own default, not ``OptimConfig``'s). A field holding a nested
section (``actor.optim``) becomes a section of its own, described by its class docstring.

The reference covers the core sections of :class:`~rlcore.config.schema.RLConfig` and the sections that
installed engine plugins contribute (``fsdp:``, ``vllm:`` ...), read from the plugin registries, so
a plugin's fields are documented from its own code. Regenerate after changing a config class::

    python -m rlcore.config.docs --output docs/config.md

``core/tests/config/test_config_docs.py`` fails when the file is stale or a field has no ``#:`` comment.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import textwrap
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

#: Registries whose entries contribute a top-level config section, with the key that selects one.
SECTION_KINDS = (
    ("train_engines", "train engine", "engine"),
    ("rollout_engines", "rollout engine", "rollout.engine"),
)

#: What ``python -m rlcore.config.docs`` is, said in the generated file and in error messages.
COMMAND = "python -m rlcore.config.docs --output docs/config.md"


@attrs.define
class FieldDoc:
    """One row of a section's table."""

    key: str  # full dotted key path, e.g. "actor.optim.lr"
    type: str  # the annotation as written in the source
    default: str  # rendered default value, e.g. "1e-6", "null", "[console, jsonl]"
    doc: str  # the ``#:`` comment, "" when there is none


@attrs.define
class Section:
    """One table of the reference: a config section (``trainer``), a nested one (``actor.optim``), or a
    plugin's section (``fsdp``)."""

    key: str  # "" for the top level
    cls: type
    description: str  # first paragraph of the class docstring
    fields: list[FieldDoc] = attrs.Factory(list)
    #: For plugin sections: what contributes the section and what selects it (one line of markdown).
    origin: str = ""
    title: str = ""
    #: Nested section fields without a ``#:`` comment whose class has no docstring either.
    undocumented_sections: list[str] = attrs.Factory(list)


# -- reading the source ---------------------------------------------------------------------------
def comment_docs(cls: type) -> dict[str, tuple[str, str]]:
    """``{field name: (annotation, doc)}`` for every annotated attribute of ``cls`` and its bases.

    ``doc`` is the block of ``#:`` comment lines directly above the attribute, joined into one line
    ("" if there is none). A subclass's own definition wins over its base's.
    """
    found: dict[str, tuple[str, str]] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not attrs.has(klass):
            continue
        found.update(_own_comment_docs(klass))
    return found


def _own_comment_docs(cls: type) -> dict[str, tuple[str, str]]:
    lines, _ = inspect.getsourcelines(cls)
    source = textwrap.dedent("".join(lines))
    tree = ast.parse(source)
    class_def = next(node for node in tree.body if isinstance(node, ast.ClassDef))
    text_lines = source.splitlines()
    docs: dict[str, tuple[str, str]] = {}
    for stmt in class_def.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        comment: list[str] = []
        row = stmt.lineno - 2  # the line above the statement, 0-based
        while row >= 0 and text_lines[row].strip().startswith("#:"):
            comment.insert(0, text_lines[row].strip()[2:].strip())
            row -= 1
        docs[stmt.target.id] = (ast.unparse(stmt.annotation), " ".join(c for c in comment if c))
    return docs


def _description(cls: type) -> str:
    """The first paragraph of ``cls``'s docstring, on one line."""
    doc = cls.__doc__
    if not doc:
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


# -- rendering values -----------------------------------------------------------------------------
def render_value(value: Any) -> str:
    """A default as a user would write it in YAML: ``null``, ``true``, ``1.0e-6``, ``[a, b]``, ``{}``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        if "e" not in text:
            return text
        # As a YAML file must spell it: PyYAML (YAML 1.1) reads 1e-6 as a string, 1.0e-6 as a float.
        mantissa, _, exponent = text.partition("e")
        sign, digits = (exponent[0], exponent[1:]) if exponent[0] in "+-" else ("+", exponent)
        return f"{mantissa if '.' in mantissa else mantissa + '.0'}e{sign}{int(digits)}"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(render_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {render_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _default_instance(cls: type) -> Any | None:
    try:
        return cls()
    except Exception:
        return None  # a section with required fields: defaults are read per field


def _field_default(field: attrs.Attribute, instance: Any) -> Any:
    if instance is not None:
        return getattr(instance, field.name)
    if field.default is attrs.NOTHING:
        return attrs.NOTHING
    if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
        return attrs.NOTHING if field.default.takes_self else field.default.factory()
    return field.default


# -- walking the config classes -------------------------------------------------------------------
def walk(cls: type, key: str, instance: Any = None, skip: Collection[str] = ()) -> list[Section]:
    """The section of ``cls`` at ``key``, followed by its nested sections (depth first).

    ``instance`` supplies the defaults (a parent's default for this section); ``skip`` names fields left
    out (``RLConfig.plugins``, whose contents are the plugin sections).
    """
    if instance is None:
        instance = _default_instance(cls)
    docs = comment_docs(cls)
    section = Section(key=key, cls=cls, description=_description(cls))
    nested: list[Section] = []
    for field in attrs.fields(cls):
        if field.name in skip:
            continue
        full = f"{key}.{field.name}" if key else field.name
        annotation, doc = docs.get(field.name, (str(field.type), ""))
        value = _field_default(field, instance)
        if value is not attrs.NOTHING and attrs.has(type(value)):
            sub = walk(type(value), full, value)
            if doc:
                sub[0].description = f"{doc} {sub[0].description}".strip() if sub[0].description else doc
            elif not sub[0].description:
                section.undocumented_sections.append(full)
            nested.extend(sub)
            continue
        default = "required" if value is attrs.NOTHING else render_value(value)
        section.fields.append(FieldDoc(full, annotation, default, doc))
    return [section, *nested]


def core_sections() -> list[Section]:
    """The sections of :class:`~rlcore.config.schema.RLConfig`, top level first."""
    from rlcore.config.schema import RLConfig

    # ``plugins`` is not a YAML key: its entries are the top-level plugin sections (see plugin_sections).
    sections = walk(RLConfig, "", skip=("plugins",))
    sections[0].title = "Top level"
    return sections


def plugin_sections(distributions: Collection[str] | None = None) -> list[Section]:
    """Sections contributed by installed engine plugins (only those from ``distributions`` if given;
    built-in components count as distribution ``rlcore``), sorted by section name."""
    from rlcore.plugins import get_plugin_manager

    manager = get_plugin_manager()
    found: list[tuple[str, str, str, str, type]] = []  # (name, kind, select key, distribution, class)
    for registry_key, kind, select in SECTION_KINDS:
        for entry in manager.registries[registry_key].entries():
            config_class = entry.options.get("config")
            if config_class is None:
                continue
            info = manager.plugins.get(entry.plugin)
            distribution = (info.distribution if info else None) or "unknown distribution"
            if distributions is not None and distribution not in distributions:
                continue
            found.append((entry.name, kind, select, distribution, config_class))
    names = [name for name, *_ in found]
    sections: list[Section] = []
    for name, kind, select, distribution, config_class in sorted(found, key=lambda f: (f[0], f[1])):
        walked = walk(config_class, name)
        head = walked[0]
        head.title = f"{name} ({kind})" if names.count(name) > 1 else name
        where = f"{config_class.__module__}.{config_class.__qualname__}"
        head.origin = (
            f"Section of the {kind} `{name}` (distribution `{distribution}`, class `{where}`); "
            f"read when `{select}: {name}`."
        )
        sections.extend(walked)
    return sections


def distributions_of(sections: Sequence[Section]) -> list[str]:
    """Distributions named in the plugin sections' origin lines, sorted."""
    found = {m.group(1) for s in sections for m in re.finditer(r"distribution `([^`]+)`", s.origin)}
    return sorted(found)


def undocumented(sections: Sequence[Section]) -> list[str]:
    """Key paths of fields without a ``#:`` comment (and of nested sections without any description)."""
    missing = [f.key for s in sections for f in s.fields if not f.doc]
    missing += [key for s in sections for key in s.undocumented_sections]
    return sorted(missing)


# -- markdown -------------------------------------------------------------------------------------
_SPHINX_ROLE = re.compile(r":(?:data|class|func|meth|mod|attr|obj):`~?")


def _cell(text: str) -> str:
    """``text`` fit for a table cell: reST roles and double backticks become markdown code spans."""
    return _SPHINX_ROLE.sub("`", text).replace("``", "`").replace("|", "\\|")


def _table(section: Section) -> Iterator[str]:
    yield "| key | type | default | description |"
    yield "|---|---|---|---|"
    for f in section.fields:
        yield f"| `{f.key}` | `{_cell(f.type)}` | `{_cell(f.default)}` | {_cell(f.doc)} |"


def render(core: Sequence[Section], plugins: Sequence[Section]) -> str:
    """The whole reference as markdown."""
    out = [
        "# Config reference",
        "",
        f"<!-- Generated from the attrs config classes by `{COMMAND}`; do not edit by hand. -->",
        "",
        "A run's config is YAML (`--config FILE`) plus dotted `key=value` overrides on the command line,",
        "checked against these tables before anything starts: an unknown key, a wrong type or a value",
        "outside its allowed set stops with the key path and what is allowed. `rlcore config` prints the",
        "resolved config; `rlcore config --defaults --engine E --rollout R` prints these defaults.",
        "",
        "```yaml",
        "trainer:",
        "  total_steps: 100      # or on the command line: trainer.total_steps=100",
        "actor:",
        "  optim:",
        "    lr: 1.0e-6          # actor.optim.lr=1e-6",
        "fsdp:                   # the selected train engine's own section",
        "  mixed_precision: bfloat16",
        "```",
        "",
        "Types are the annotations in the source; `X | None` accepts `null`. A list given a single",
        "value on the command line (`data.train_files=a.parquet`) is a list of one. In a YAML file write",
        "small floats with a dot, `1.0e-6`: YAML 1.1 reads `1e-6` as a string, which the type check",
        "rejects.",
        "",
        "## Core sections",
        "",
    ]
    for section in core:
        out += _section(section, level=3)
    dists = distributions_of(plugins)
    out += [
        "## Plugin sections",
        "",
        "Each train or rollout engine plugin contributes one top-level section named after the engine;",
        "only the sections of the selected engines (`engine`, `rollout.engine`) are used, and an installed",
        "but unselected plugin's section is still type-checked. This reference was generated with "
        + (", ".join(f"`{d}`" for d in dists) if dists else "no engine plugins")
        + " installed; `rlcore config --defaults --engine NAME` shows any plugin's section.",
        "",
    ]
    for section in plugins:
        out += _section(section, level=3)
    return "\n".join(out).rstrip() + "\n"


def _section(section: Section, level: int) -> list[str]:
    title = section.title or section.key
    lines = [f"{'#' * level} {'`' + title + '`' if title == section.key else title}", ""]
    if section.origin:
        lines += [section.origin, ""]
    if section.description:
        lines += [_cell(section.description), ""]
    if section.fields:
        lines += [*_table(section), ""]
    return lines


def generate(distributions: Collection[str] | None = None) -> tuple[str, list[str]]:
    """``(markdown, undocumented key paths)`` for the core config and the installed plugin sections."""
    core, plugins = core_sections(), plugin_sections(distributions)
    return render(core, plugins), undocumented([*core, *plugins])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlcore.config.docs", description="Generate the config reference (markdown)."
    )
    parser.add_argument("--output", "-o", help="write here instead of stdout")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if --output differs from what would be generated"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="DIST",
        help="document plugin sections of these distributions only (built-ins are `rlcore`)",
    )
    args = parser.parse_args(argv)
    text, missing = generate(args.only)
    if missing:
        print("config fields without a #: doc comment: " + ", ".join(missing), file=sys.stderr)
        return 1
    if args.check:
        if not args.output:
            parser.error("--check needs --output")
        current = Path(args.output).read_text() if Path(args.output).is_file() else ""
        if current != text:
            print(f"{args.output} is out of date; regenerate it with: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
