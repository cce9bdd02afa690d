"""``rlcore env build NAME`` and ``rlcore env list``: the roles' Python environments on this node."""

from __future__ import annotations

import json
from typing import Any

import attrs

from rlcore.cli.commands import UserError, _load


def _config(args: Any) -> Any:
    """The config that may define environments: the user's file and overrides, else the defaults."""
    args.engine = args.rollout = None  # env build and list have no --engine or --rollout
    if args.config_file or args.overrides:
        return _load(args)
    from rlcore.config.schema import RLConfig

    return RLConfig()


def cmd_env_build(args: Any) -> int:
    from rlcore.envs.overlay import BuildError, build
    from rlcore.envs.spec import EnvironmentProblem, spec_for

    config = _config(args)
    try:
        spec = spec_for(config, args.name)
    except EnvironmentProblem as exc:
        raise UserError(str(exc)) from None
    pip_args = [arg for d in args.find_links for arg in ("--find-links", d)]
    pip_args += ["--no-index"] if args.no_index else []
    try:
        path = build(spec, pip_args=pip_args, force=args.force)
    except BuildError as exc:
        raise UserError(f"building environment {args.name!r} ({spec.source}): {exc}") from None
    print(path)
    return 0


def cmd_env_list(args: Any) -> int:
    """Every environment built under this node's home, and the state here of those the config's roles
    name; exit 1 if one of those is not ready."""
    from rlcore.envs.overlay import read_marker, status
    from rlcore.envs.spec import EnvironmentProblem, env_home, role_env_specs

    config = _config(args)
    home = env_home()
    built = sorted(p for p in home.iterdir() if p.is_dir()) if home.is_dir() else []
    rows = [{"folder": p.name, **(read_marker(p) or {"state": "incomplete"})} for p in built]
    try:
        wanted = role_env_specs(config)
    except EnvironmentProblem as exc:
        raise UserError(str(exc)) from None
    roles = {role: {"name": spec.name, **attrs.asdict(status(spec, home))} for role, spec in wanted.items()}
    if args.json:
        print(json.dumps({"home": str(home), "built": rows, "roles": roles}, indent=2))
    else:
        print(f"environments on this node ({home}):")
        for row in rows or [{"folder": "(none)"}]:
            print(f"  {row['folder']:<32} {' '.join(row.get('requirements', [])) or row.get('state', '')}")
        for role, row in roles.items():
            detail = f": {row['detail']}" if row["detail"] else ""
            print(f"role {role}: environment {row['name']} is {row['state']}{detail}")
    return 1 if any(row["state"] != "ready" for row in roles.values()) else 0
