"""``rlcore``: train, inspect plugins and config, report the environment.

Errors the user can fix (bad config, unknown engine, broken plugin) print one clear message and exit 2;
they never show a Python traceback from rlcore itself.
"""

from __future__ import annotations

import argparse
import sys

from rlcore import __version__


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", help="train engine plugin (fsdp, megatron, ...)")
    parser.add_argument("--rollout", help="rollout engine plugin (vllm, sglang, hf, ...)")
    parser.add_argument("--config", dest="config_file", metavar="FILE", help="YAML config file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlcore", description="RL post-training of LLMs with pluggable engines."
    )
    parser.add_argument("--version", action="version", version=f"rlcore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser("train", help="run training (GRPO on a built-in task by default)")
    _add_config_args(train)
    train.add_argument(
        "--ray-address", help="join this Ray cluster (default: RAY_ADDRESS, else start a local one)"
    )
    train.add_argument(
        "--verbose",
        action="store_true",
        help="show engine and library output on the terminal (trainer.log_level=info); by default it "
        "goes to <run dir>/logs/",
    )

    plugins = sub.add_parser("plugins", help="list installed plugins and what they register")
    plugins.add_argument("--json", action="store_true", help="print a JSON list")

    config = sub.add_parser("config", help="show the default or resolved config; validate")
    _add_config_args(config)
    mode = config.add_mutually_exclusive_group()
    mode.add_argument("--defaults", action="store_true", help="show defaults for the selected engines")
    mode.add_argument("--validate", action="store_true", help="only validate (exit 0 when valid)")
    config.add_argument("--json", action="store_true", help="print JSON instead of YAML")

    env = sub.add_parser(
        "env", help="versions and visible devices; build and list the roles' Python environments"
    )
    env.add_argument("--json", action="store_true", help="print JSON")
    env_sub = env.add_subparsers(dest="env_action", metavar="ACTION")
    build = env_sub.add_parser("build", help="build environment NAME on this node (docs/environments.md)")
    build.add_argument("name", metavar="NAME", help="a name under environments.requirements, or a plugin's")
    build.add_argument("--config", dest="config_file", metavar="FILE", help="YAML config defining it")
    build.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
    build.add_argument("--force", action="store_true", help="build again even if it is ready")
    build.add_argument("--find-links", action="append", default=[], metavar="DIR", help="pip --find-links")
    build.add_argument(
        "--no-index", action="store_true", help="pip --no-index (wheels from --find-links only)"
    )
    build.set_defaults(handler="rlcore.cli.envs:cmd_env_build")
    listing = env_sub.add_parser("list", help="the environments on this node and the ones a config names")
    listing.add_argument("--config", dest="config_file", metavar="FILE", help="YAML config")
    listing.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
    listing.set_defaults(handler="rlcore.cli.envs:cmd_env_list")

    export = sub.add_parser("export", help="write a Hugging Face folder from a training checkpoint")
    export.add_argument("checkpoint", help="checkpoint directory (runs/<name>/checkpoints/step_N)")
    export.add_argument("--out", required=True, help="output folder")
    export.add_argument("--role", default="actor", help="which role's model to export (default: actor)")

    new_plugin = sub.add_parser("new-plugin", help="write a working plugin package to start from")
    new_plugin.add_argument("name", metavar="NAME", help="plugin name: lowercase letters, digits, hyphens")
    new_plugin.add_argument(
        "--kind",
        required=True,
        choices=("train", "rollout", "reward", "tool", "device", "transport"),
        metavar="KIND",
        help="what the plugin provides: train, rollout, reward, tool, device or transport",
    )
    new_plugin.add_argument("--dir", default=".", metavar="PATH", help="where rlcore-NAME/ goes (default: .)")
    new_plugin.set_defaults(handler="rlcore.cli.new_plugin:cmd_new_plugin")
    return parser


def _load_handler(target: str):
    """A subcommand implemented outside ``commands`` (``"module:function"``), imported when it runs."""
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `key=value` overrides may follow options too (`rlcore env build NAME --no-index key=value`): argparse
    # has given the positional list out before it reached them.
    overrides = [word for word in extra if "=" in word and not word.startswith("-")]
    if hasattr(args, "overrides") and overrides:
        args.overrides = [*args.overrides, *overrides]
        extra = [word for word in extra if word not in overrides]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from rlcore.cli import commands

    target = getattr(args, "handler", None)  # a subcommand's own module, else commands.cmd_<name>
    handler = _load_handler(target) if target else getattr(commands, f"cmd_{args.command}")
    try:
        return handler(args) or 0
    except commands.UserError as exc:
        print(f"rlcore {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
