"""docs/cli.md documents every command, option and argument of ``rlcore`` (read from the real parser),
and no option the parser does not have."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from rlcore.cli.main import build_parser

DOC = Path(__file__).resolve().parents[3] / "docs" / "cli.md"
SHARED = "Selecting the config"  # the section documenting the config options of train and config


def subcommands(
    parser: argparse.ArgumentParser | None = None, prefix: str = ""
) -> dict[str, argparse.ArgumentParser]:
    """Every subcommand by its words (``train``, ``env``, ``env build`` ...), nested ones included."""
    parser = parser or build_parser()
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[prefix + name] = sub
                found.update(subcommands(sub, f"{prefix}{name} "))
    return found


def sections() -> dict[str, str]:
    """Level-2 sections of the doc by title (``rlcore train``, ``Selecting the config`` ...)."""
    parts = re.split(r"^## (.+)$", DOC.read_text(), flags=re.M)
    return {title.strip("`"): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def table_rows(text: str) -> list[str]:
    """First cells of the tables in ``text``, without their backticks (``--out OUT``, ``checkpoint``)."""
    return [m.group(1) for m in re.finditer(r"^\| `([^`]+)`", text, flags=re.M)]


def documented_names(rows: list[str]) -> set[str]:
    """``--engine ENGINE`` -> ``--engine``; ``key=value ...`` -> ``key=value``."""
    return {row.split()[0] for row in rows}


def arguments(sub: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """(option strings, positional names) of a subcommand, without -h/--help."""
    options, positionals = set(), set()
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            options.update(action.option_strings)
        else:
            positionals.add(action.metavar or action.dest)
    return options, positionals


def test_every_subcommand_has_a_section_with_its_synopsis():
    docs = sections()
    for name, sub in subcommands().items():
        title = f"rlcore {name}"
        assert title in docs, f"docs/cli.md has no section '## `{title}`'"
        usage = " ".join(sub.format_usage().split())
        synopsis = re.search(r"```\n(rlcore [^\n]+)\n```", docs[title])
        assert synopsis, f"section {title!r} has no synopsis block"
        for token in re.findall(r"--[a-z-]+|\bkey=value\b|\bcheckpoint\b", usage):
            assert token in synopsis.group(1), f"{token} missing from the synopsis of {title!r}"


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_option_and_argument_is_documented_and_nothing_else(name):
    docs = sections()
    sub = subcommands()[name]
    options, positionals = arguments(sub)
    rows = table_rows(docs[f"rlcore {name}"])
    if "--engine" in options:  # train and config share the config options' table
        rows += table_rows(docs[SHARED])
    names = documented_names(rows)
    for option in sorted(options):
        assert option in names, f"{option} of `rlcore {name}` is not in a table of docs/cli.md"
    for positional in sorted(positionals):
        assert positional in names, f"argument {positional} of `rlcore {name}` is not documented"
    extra = {n for n in names if n.startswith("-")} - options
    assert not extra, f"docs/cli.md documents {sorted(extra)} for `rlcore {name}`, which has no such option"


def test_top_level_version_and_commands_table():
    text = DOC.read_text()
    parser = build_parser()
    top = {s for a in parser._actions for s in a.option_strings} - {"-h", "--help"}
    for option in top:
        assert f"rlcore {option}" in text
    overview = text.split("\n## ", 1)[0]
    for name in subcommands():
        assert f"| [`rlcore {name}`](#rlcore-{name.replace(' ', '-')}) |" in overview, (
            f"rlcore {name} missing from the overview"
        )
