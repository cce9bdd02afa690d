"""The house rules, read from the code's own imports: no import circle in core or the plugins, every
import goes down the layers of ``rlcore.testing.imports.CORE_LAYERS``, plugins import only the public
face, no folder holds more than 15% of the code, and docs/concepts.md's table names every folder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rlcore.testing.imports import (
    CORE_LAYERS,
    PUBLIC,
    draw,
    find_cycles,
    import_graph,
    installed_modules,
    layering_violations,
    package_modules,
    unit_graph,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"rlcore": ROOT / "core" / "rlcore"} | {
    path.name: path for path in sorted(ROOT.glob("plugins/*/rlcore_*")) if (path / "__init__.py").exists()
}


@pytest.fixture(scope="module")
def graph():
    modules = {}
    for name, root in PACKAGES.items():
        modules.update(package_modules(name, root))
    return import_graph(modules)


def test_the_packages_read_are_the_installed_ones():
    # The graph is read from the checkout; the suite imports the installed packages: the same files.
    installed = installed_modules(["rlcore"])
    assert installed["rlcore.trainer.loop"] == PACKAGES["rlcore"] / "trainer" / "loop.py"
    assert len(PACKAGES) == 7, sorted(PACKAGES)  # core and six plugins


def test_no_import_circles(graph):
    cycles = find_cycles(graph)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_imports_go_down_the_layers_and_plugins_use_the_public_face(graph):
    problems = layering_violations(graph)
    assert not problems, "\n".join(problems)


def test_every_core_folder_and_top_level_module_has_a_layer(graph):
    units = {u for u in unit_graph(graph) if u == "rlcore" or u.startswith("rlcore.")}
    layered = {u for _, names in CORE_LAYERS for u in names}
    assert units == layered


def test_no_folder_holds_more_than_15_percent_of_the_code():
    lines: dict[Path, int] = {}
    for root in PACKAGES.values():
        for path in root.rglob("*.py"):
            if "tests" in path.relative_to(ROOT).parts:
                continue
            lines[path.parent] = lines.get(path.parent, 0) + len(path.read_text().splitlines())
    total = sum(lines.values())
    biggest = max(lines, key=lines.get)
    assert lines[biggest] <= 0.15 * total, (
        f"{biggest.relative_to(ROOT)} holds {lines[biggest]} of {total} lines ({lines[biggest] / total:.0%})"
    )


def test_concepts_table_names_every_folder_with_its_layer_and_visibility():
    text = (ROOT / "docs" / "concepts.md").read_text()
    section = text[text.index("## Architecture") :]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`(rlcore[\w.]*)`", cells[0]) if len(cells) >= 4 else None
        if match:
            rows[match.group(1)] = cells
    for layer, names in CORE_LAYERS:
        for unit in names:
            assert unit in rows, f"docs/concepts.md's architecture table has no row for {unit}"
            assert rows[unit][1] == layer, (
                f"{unit}: the table says layer {rows[unit][1]!r}, the code {layer!r}"
            )
            visibility = "public" if unit in PUBLIC else "internal"
            assert visibility in rows[unit][3], f"{unit} is {visibility}; the table says {rows[unit][3]!r}"


# -- the checks themselves can fail ------------------------------------------------------------------
def test_a_circle_is_found_and_named(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg import c  # lazy: still an edge\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from . import a\n")  # relative, outside the circle
    graph = import_graph(package_modules("pkg", pkg))
    assert graph["pkg.d"] == {"pkg.a"}
    assert find_cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]


def test_an_upward_import_and_a_plugin_reaching_inside_are_reported():
    graph = {
        "rlcore.api.batch": {"rlcore.trainer.loop"},
        "rlcore_x.engine": {"rlcore.cluster.roles", "rlcore.api"},
        "rlcore.trainer.loop": {"rlcore.api.batch"},
        "acme_rl.engine": {"rlcore.trainer.loop", "rlcore.kernels.logits"},  # a third party's package
    }
    problems = layering_violations(graph)
    assert len(problems) == 3, problems
    assert "acme_rl.engine imports rlcore.trainer.loop: rlcore.trainer is internal" in problems[0]
    assert "rlcore.api.batch imports rlcore.trainer.loop" in problems[1]
    assert "rlcore_x.engine imports rlcore.cluster.roles: rlcore.cluster is internal" in problems[2]


def test_the_picture_is_drawn_from_the_graph(graph, tmp_path):
    path = tmp_path / "architecture.png"
    draw(unit_graph(graph), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
