"""The import graph of Python packages, read from their source, and the house rules checked on it.

Every ``import`` and ``from ... import`` statement counts, wherever it stands: at module level, inside a
function (a lazy import is still a dependency) or under ``if TYPE_CHECKING``. An edge goes from the
importing module to the imported one when both belong to the packages read; ``from package import name``
points at the submodule ``package.name`` when there is one, else at the package itself. Test folders
(``tests``) are left out: they sit above everything.

>>> graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
>>> find_cycles(graph)
[['a', 'b', 'c', 'a']]

Core's own layering, :data:`CORE_LAYERS`: each folder (or top-level module) of ``rlcore`` sits in one
layer and imports only from its own layer or lower ones; a plugin imports only :data:`PUBLIC` units.
``python -m rlcore.testing.imports --png FILE`` draws the graph between folders, layer by layer
(docs/concepts.md's picture).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path

#: Core's folders and top-level modules, bottom layer first. A unit imports only units of its own
#: layer or below (and a layer's units never import each other in a circle).
CORE_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("contracts", ("rlcore", "rlcore.api", "rlcore.hookspecs")),
    ("plugin loading", ("rlcore.plugins", "rlcore.devices")),
    (
        "components",
        (
            "rlcore.kernels",
            "rlcore.weights",
            "rlcore.adapters",
            "rlcore.safe_dcp",
            "rlcore.telemetry",
            "rlcore.data",
            "rlcore.vision",
            "rlcore.tasks",
            "rlcore.models",
            "rlcore.sandbox",
            "rlcore.algorithms",
            "rlcore.transports",
            "rlcore.rollout",
            "rlcore.agents",
            "rlcore.endpoint",
            "rlcore.rewards",
            "rlcore.distill",
            "rlcore.envs",
            "rlcore.testing",
        ),
    ),
    ("assembly", ("rlcore.config", "rlcore.builtin")),
    ("cluster", ("rlcore.cluster",)),
    ("flows", ("rlcore.flows", "rlcore.stream")),
    ("trainer", ("rlcore.trainer",)),
    ("cli", ("rlcore.cli",)),
)

#: Units a plugin (``rlcore_*``, and any third party's) may import: the SDK's public face. The rest
#: (plugin loading, built-ins, data loading, reporting, the cluster, the trainer, the CLI) is internal.
PUBLIC = frozenset(
    {
        "rlcore",
        "rlcore.hookspecs",
        "rlcore.api",
        "rlcore.testing",
        "rlcore.devices",
        "rlcore.weights",
        "rlcore.adapters",
        "rlcore.safe_dcp",
        "rlcore.kernels",
        "rlcore.transports",
        "rlcore.rollout",
        "rlcore.vision",
        "rlcore.algorithms",
        "rlcore.rewards",
        "rlcore.agents",
        "rlcore.sandbox",
        "rlcore.config",
        "rlcore.flows",
    }
)


def package_modules(name: str, root: Path) -> dict[str, Path]:
    """``{module name: source file}`` of package ``name`` whose ``__init__.py`` is in ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("").parts
        if "tests" in rel or "__pycache__" in rel:
            continue
        if rel[-1] == "__init__":
            rel = rel[:-1]
        modules[".".join((name, *rel))] = path
    return modules


def installed_modules(packages: Iterable[str]) -> dict[str, Path]:
    """:func:`package_modules` of each importable package in ``packages`` (found without importing it)."""
    modules: dict[str, Path] = {}
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"{name!r} is not an importable package here")
        modules.update(package_modules(name, Path(next(iter(spec.submodule_search_locations)))))
    return modules


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """``{module: modules it imports}`` among ``modules`` (see the module doc for what counts)."""

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(filter(None, (owner(alias.name) for alias in node.names)))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = module.split(".") if is_package else module.split(".")[:-1]
                    base = ".".join(
                        parts[: len(parts) - node.level + 1] + ([node.module] if node.module else [])
                    )
                else:
                    base = node.module or ""
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    target = sub if sub in modules else owner(base)
                    if target:
                        targets.add(target)
        targets.discard(module)
        graph[module] = targets
    return graph


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node, as a closed path
    (``[a, b, ..., a]``) starting at the component's smallest name; sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(root: str) -> None:
        # Tarjan's algorithm, iterative: the import graph of a big package is deeper than the recursion limit.
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(_cycle_through(graph, min(c), c) for c in components)


def _cycle_through(graph: Mapping[str, Iterable[str]], start: str, component: set[str]) -> list[str]:
    """A shortest path ``start -> ... -> start`` inside ``component`` (breadth first)."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if child in component and child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{start} is not on a cycle")


def unit_of(module: str) -> str:
    """The folder or top-level module of ``rlcore`` that ``module`` belongs to (``rlcore.cluster.roles``
    -> ``rlcore.cluster``); for any other package, its top-level name (``rlcore_fsdp``)."""
    parts = module.split(".")
    if parts[0] != "rlcore":
        return parts[0]
    return ".".join(parts[:2])


def unit_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """The module graph folded onto :func:`unit_of`; self-edges dropped."""
    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = units.setdefault(unit_of(module), set())
        edges.update(unit_of(t) for t in targets)
    for unit, edges in units.items():
        edges.discard(unit)
    return units


def _is_core(unit: str) -> bool:
    return unit == "rlcore" or unit.startswith("rlcore.")


def layer_of() -> dict[str, int]:
    """``{unit: layer number}`` from :data:`CORE_LAYERS` (0 at the bottom)."""
    return {unit: i for i, (_, units) in enumerate(CORE_LAYERS) for unit in units}


def layering_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """One line per import that breaks the rules: a core unit importing a higher layer, a core unit
    missing from :data:`CORE_LAYERS`, or a plugin (any package but ``rlcore``) importing an internal
    unit. Names the modules."""
    layers = layer_of()
    problems = []
    for module, targets in sorted(graph.items()):
        unit = unit_of(module)
        for target in sorted(targets):
            to = unit_of(target)
            if to == unit or not _is_core(to):
                continue
            if not _is_core(unit):
                if to not in PUBLIC:
                    problems.append(
                        f"{module} imports {target}: {to} is internal; plugins import only {sorted(PUBLIC)}"
                    )
                continue
            for name in (unit, to):
                if name not in layers:
                    problems.append(f"{name} is in no layer of rlcore.testing.imports.CORE_LAYERS: add it")
            if unit in layers and to in layers and layers[to] > layers[unit]:
                problems.append(
                    f"{module} imports {target}: {unit} ({CORE_LAYERS[layers[unit]][0]}) may not import the "
                    f"higher layer {to} ({CORE_LAYERS[layers[to]][0]})"
                )
    return sorted(set(problems))


def draw(units: Mapping[str, Iterable[str]], path: Path) -> None:
    """Draw the unit graph to ``path`` (PNG): one row per layer of :data:`CORE_LAYERS`, bottom layer at
    the bottom, plugins on top; an arrow per import edge between units, from importer to imported."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [list(names) for _, names in CORE_LAYERS]
    plugins = sorted(u for u in units if not _is_core(u))
    rows.append(plugins)
    labels = [name for name, _ in CORE_LAYERS] + ["plugins"]
    position = {}
    for y, row in enumerate(rows):
        present = [u for u in row if u in units or any(u in t for t in units.values())]
        for x, unit in enumerate(present):
            position[unit] = ((x + 0.5) / len(present), y)
    fig, ax = plt.subplots(figsize=(15, 10))
    for unit, targets in units.items():
        for target in targets:
            if unit in position and target in position:
                (x0, y0), (x1, y1) = position[unit], position[target]
                same_row = y0 == y1  # an import inside a layer: an arc above the row, not through its boxes
                ax.annotate(
                    "",
                    xy=(x1, y1 + (0.1 if same_row else 0.12)),
                    xytext=(x0, y0 + 0.1 if same_row else y0 - 0.12),
                    arrowprops={
                        "arrowstyle": "->",
                        "color": "#c07030" if same_row else "#8899aa",
                        "alpha": 0.6 if same_row else 0.45,
                        "lw": 0.8,
                        "connectionstyle": f"arc3,rad={-0.35 if x1 > x0 else 0.35}" if same_row else "arc3",
                    },
                )
    for unit, (x, y) in position.items():
        public = unit in PUBLIC or not _is_core(unit)
        ax.text(
            x,
            y,
            unit.removeprefix("rlcore.") if unit != "rlcore" else "rlcore (root)",
            ha="center",
            va="center",
            fontsize=9,
            bbox={"boxstyle": "round", "fc": "#dff0d8" if public else "#f2f2f2", "ec": "#555555"},
        )
    for y, label in enumerate(labels):
        ax.text(-0.02, y, label, ha="right", va="center", fontsize=10, style="italic")
    ax.set_xlim(-0.2, 1.02)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.axis("off")
    ax.set_title(
        "rlcore's import graph between folders, drawn from the code's imports "
        "(arrow: importer -> imported, orange inside a layer;\ngreen: public face, grey: internal)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "packages",
        nargs="*",
        help="plugin packages to read beside rlcore (default: every installed plugin's)",
    )
    parser.add_argument("--png", type=Path, help="draw the folder graph to this PNG")
    args = parser.parse_args(argv)
    # rlcore is always read: a plugin's imports of it are checked against the public face.
    packages = ["rlcore", *dict.fromkeys(args.packages or _installed_plugins())]
    graph = import_graph(installed_modules(packages))
    cycles = find_cycles(graph)
    for cycle in cycles:
        print("import circle: " + " -> ".join(cycle))
    problems = layering_violations(graph)
    for line in problems:
        print(line)
    if args.png:
        draw(unit_graph(graph), args.png)
        print(f"wrote {args.png}")
    return 1 if cycles or problems else 0


def _installed_plugins() -> list[str]:
    """The top-level packages of the installed ``rlcore`` entry points (``rlcore_fsdp`` ..., and any third
    party's), read from the entry points rather than listed, so a new plugin is checked without an edit."""
    import importlib.metadata as md

    tops = {ep.value.partition(":")[0].split(".")[0] for ep in md.entry_points(group="rlcore")}
    return sorted(n for n in tops if n != "rlcore" and importlib.util.find_spec(n) is not None)


if __name__ == "__main__":
    raise SystemExit(main())
