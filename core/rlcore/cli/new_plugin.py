"""``rlcore new-plugin NAME --kind KIND``: write a working plugin package to start from.

The skeleton is a folder ``rlcore-NAME/`` holding a setuptools ``pyproject.toml`` with the ``rlcore`` entry
point, the package ``rlcore_NAME/`` (``plugin.py`` registering one component lazily, the component itself
with a small but real implementation, ``config.py`` for engines), ``tests/`` (the contract suite for
engines, tests of the component otherwise, and a test that the entry point is discovered) and a README.
``pip install -e rlcore-NAME`` followed by ``pytest`` in it passes as written.

The files are templates under ``rlcore/assets/new_plugin/``: ``common/`` for every kind and one folder per
kind; a ``package/`` folder becomes ``rlcore_NAME/``, the ``.tmpl`` suffix is dropped, and ``{{key}}``
placeholders are replaced by :func:`template_values`.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.resources
import re
import sys
from pathlib import Path
from typing import Any

#: ``--kind`` -> (registry key, hook, what the component is called in messages)
KINDS: dict[str, tuple[str, str, str]] = {
    "train": ("train_engines", "register_train_engines", "train engine"),
    "rollout": ("rollout_engines", "register_rollout_engines", "rollout engine"),
    "reward": ("reward_providers", "register_reward_providers", "reward provider"),
    "tool": ("tools", "register_tools", "agent tool"),
    "device": ("device_platforms", "register_device_platforms", "device platform"),
    "transport": ("weight_transports", "register_weight_transports", "weight transport"),
}

NAME_RULE = (
    "lowercase letters, digits and single hyphens, starting with a letter and not ending with a hyphen "
    "(e.g. 'toy', 'my-engine2')"
)
_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
#: Longest NAME: it also names a Python package and a distribution.
MAX_NAME = 40
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
#: Requirements of rlcore's own that a kind's package also declares (ranges copied from rlcore's).
_KIND_REQUIREMENTS = {
    "train": ("torch", "transformers", "safetensors"),
    "rollout": ("torch", "transformers", "safetensors"),
    "reward": ("torch",),
    "tool": (),
    "device": ("torch", "psutil"),
    "transport": ("torch", "safetensors"),
}
#: Used when rlcore's metadata cannot be read (a source checkout run without installing).
_FALLBACK_RANGES = {
    "torch": ">=2.6",
    "transformers": ">=4.50",
    "safetensors": ">=0.4",
    "psutil": ">=5.9",
}


class NewPluginError(ValueError):
    """A NAME, kind or destination :func:`new_plugin` refuses; the message says what to change."""


def check_name(name: str) -> None:
    """Raise :class:`NewPluginError` unless ``name`` is a valid plugin name (see :data:`NAME_RULE`)."""
    if not _NAME.match(name):
        raise NewPluginError(f"invalid plugin name {name!r}: a name is {NAME_RULE}")
    if len(name) > MAX_NAME:
        raise NewPluginError(f"invalid plugin name {name!r}: at most {MAX_NAME} characters, got {len(name)}")


def rlcore_range(version: str) -> str:
    """The range of rlcore versions a new plugin accepts: the current minor series (``>=0.1,<0.2``), or
    the current major one from 1.0 on (``>=1.3,<2``)."""
    parts = [int(p) for p in re.findall(r"\d+", version)[:2]] + [0, 0]
    major, minor = parts[0], parts[1]
    if major == 0:
        return f">={major}.{minor},<0.{minor + 1}"
    return f">={major}.{minor},<{major + 1}"


def _rlcore_requirements() -> dict[str, str]:
    """``{project: version range}`` of rlcore's own dependencies (``torch: >=2.6``)."""
    found = dict(_FALLBACK_RANGES)
    try:
        requires = md.requires("rlcore") or []
    except md.PackageNotFoundError:
        return found
    for line in requires:
        if ";" in line:  # an extra or a marker: not a plain dependency
            continue
        match = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(.*)$", line.strip())
        if match and match.group(2):
            found[match.group(1).lower()] = match.group(2).replace(" ", "")
    return found


def template_values(name: str, kind: str) -> dict[str, str]:
    """What the templates' ``{{key}}`` placeholders stand for, for plugin ``name`` of ``kind``."""
    from rlcore import __version__
    from rlcore.plugins.compat import DEFAULT_RANGE

    snake = name.replace("-", "_")
    ranges = _rlcore_requirements()
    dependencies = [f"rlcore{rlcore_range(__version__)}"]
    dependencies += [f"{project}{ranges[project]}" for project in _KIND_REQUIREMENTS[kind]]
    return {
        "name": name,
        "snake": snake,
        "upper": snake.upper(),
        "Class": "".join(part.capitalize() for part in name.split("-")),
        "package": f"rlcore_{snake}",
        "dist": f"rlcore-{name}",
        "kind": kind,
        "what": KINDS[kind][2],
        "a_what": ("an " if KINDS[kind][2][0] in "aeiou" else "a ") + KINDS[kind][2],
        "hook": KINDS[kind][1],
        "registry": KINDS[kind][0],
        # Every minor of this API's major: what the in-tree plugins declare (rlcore.plugins.compat).
        "api": f'"{DEFAULT_RANGE}"',
        "rlcore_version": __version__,
        "dependencies": ", ".join(f'"{d}"' for d in dependencies),
    }


def render(text: str, values: dict[str, str], source: str = "template") -> str:
    """``text`` with every ``{{key}}`` replaced; an unknown key is an error naming the template."""

    def one(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"{source}: unknown placeholder {{{{{key}}}}}; known: {', '.join(sorted(values))}")
        return values[key]

    return _PLACEHOLDER.sub(one, text)


def _templates(kind: str) -> list[tuple[str, Any]]:
    """``(relative path, resource)`` of every template file of ``kind`` (common ones first)."""
    root = importlib.resources.files("rlcore") / "assets" / "new_plugin"
    found: list[tuple[str, Any]] = []

    def walk(node: Any, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.name == "__pycache__":
                continue
            rel = f"{prefix}{child.name}"
            if child.is_dir():
                walk(child, rel + "/")
            elif child.name.endswith(".tmpl"):
                found.append((rel.removesuffix(".tmpl"), child))

    for part in ("common", kind):
        walk(root / part, "")
    return found


def plan(name: str, kind: str) -> dict[str, str]:
    """``{path inside rlcore-NAME/: content}`` of the skeleton; nothing is written."""
    check_name(name)
    if kind not in KINDS:
        raise NewPluginError(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    values = template_values(name, kind)
    files: dict[str, str] = {}
    for rel, resource in _templates(kind):
        parts = rel.split("/")
        path = "/".join(values["package"] if p == "package" else p for p in parts)
        files[path] = render(resource.read_text(encoding="utf-8"), values, f"new_plugin/{kind}/{rel}")
    return files


def _registered_elsewhere(name: str, kind: str) -> str | None:
    """Which loaded plugin already registers ``name`` for ``kind`` (a second registration is an error),
    or ``None``."""
    try:
        from rlcore.plugins import registry

        reg = registry(KINDS[kind][0])
        return reg.entry(name).plugin if name in reg else None
    except Exception:  # a broken plugin environment must not stop writing a skeleton
        return None


def new_plugin(name: str, kind: str, directory: str | Path = ".") -> Path:
    """Write the skeleton of plugin ``name`` (a ``kind`` component) to ``directory/rlcore-NAME``; return
    that folder. Refuses an invalid name, an unknown kind, a name another installed plugin registers for
    the same kind, and an existing folder."""
    files = plan(name, kind)
    target = Path(directory) / f"rlcore-{name}"
    if target.exists() or target.is_symlink():
        raise NewPluginError(
            f"{target} already exists; remove it or pass another --dir (nothing was written)"
        )
    owner = _registered_elsewhere(name, kind)
    if owner is not None:
        raise NewPluginError(
            f"a {KINDS[kind][2]} named {name!r} is already registered by plugin {owner!r}; a name can be "
            f"registered once, so pick another NAME (nothing was written)"
        )
    for rel, text in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return target


def cmd_new_plugin(args: Any) -> int:
    """``rlcore new-plugin``: write the skeleton and say what to do next."""
    from rlcore.cli.commands import UserError

    try:
        target = new_plugin(args.name, args.kind, args.dir)
    except (NewPluginError, OSError) as exc:
        raise UserError(str(exc)) from None
    values = template_values(args.name, args.kind)
    out = sys.stdout
    print(f"wrote {target}/: {values['a_what']} plugin, registered as {args.name!r}", file=out)
    for path in sorted(p for p in target.rglob("*") if p.is_file()):
        print(f"  {path.relative_to(target)}", file=out)
    print("next:", file=out)
    # The interpreter running rlcore, by path: a bare `pip`/`pytest` may belong to another Python.
    print(f"  {sys.executable} -m pip install -e {target}", file=out)
    print(f"  cd {target} && {sys.executable} -m pytest", file=out)
    return 0
