"""A plugin that loads but cannot work on this machine says so through ``plugin_status()`` (shown by
``rlcore plugins`` as a ``note``), instead of failing to import: rlcore-sglang where SGLang is absent."""

import types

from rlcore.cli.listing import format_plugins
from rlcore.plugins import PluginInfo, _status_note


def module(**attrs):
    return types.SimpleNamespace(__name__="rlcore_x.plugin", **attrs)


def test_status_note_from_the_plugin_module():
    assert _status_note(module()) is None  # plugins without the function are ready
    assert _status_note(module(plugin_status=lambda: None)) is None
    assert _status_note(module(plugin_status=lambda: "libfoo missing: pip install foo")) == (
        "libfoo missing: pip install foo"
    )

    def broken():
        raise OSError("cannot read /proc")

    assert _status_note(module(plugin_status=broken)) == "plugin_status() raised OSError: cannot read /proc"


def test_the_note_is_listed_under_the_plugin_wrapped_to_the_terminal():
    info = PluginInfo(
        name="sglang",
        distribution="rlcore-sglang",
        version="0.1.0",
        module="rlcore_sglang.plugin",
        status="loaded",
        registers={"rollout_engines": ["sglang"]},
        note="sglang is not installed here: install it on a CUDA machine " * 3,
    )
    lines = format_plugins([info], width=80).splitlines()
    assert lines[0] == "sglang (rlcore-sglang 0.1.0): loaded"
    assert lines[1].split() == ["rollout", "engines", "sglang"]
    assert lines[2].startswith("  note                   sglang is not installed here")
    assert len(lines) > 3 and all(len(line) <= 80 for line in lines)
    assert lines[3].startswith(" " * 25)
