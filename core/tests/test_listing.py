"""`rlcore plugins` fits an 80-column terminal: the installed plugins' real listing, and a failed plugin
whose error is long."""

from rlcore.cli.listing import format_plugins
from rlcore.plugins import PluginInfo, get_plugin_manager


def test_installed_plugins_fit_80_columns_and_name_everything():
    infos = list(get_plugin_manager().plugins.values())
    text = format_plugins(infos, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    for info in infos:
        for names in info.registers.values():
            for name in names:
                assert name in text  # wrapped, never cut off with an ellipsis
    assert "fsdp (rlcore-fsdp " in text
    # The SGLang plugin's own environment (RLCORE_PLUGIN_ENV) and the command that builds it.
    assert "environment            rlcore-sglang[cuda] (rlcore env build sglang)" in text


def test_a_failed_plugin_shows_its_error_wrapped():
    failed = PluginInfo(
        name="broken",
        distribution="rlcore-broken",
        version="0.3.0",
        module="rlcore_broken.plugin",
        status="failed",
        error="ModuleNotFoundError: No module named 'sglang'; " + "install it on a CUDA machine " * 5,
    )
    lines = format_plugins([failed], width=80).splitlines()
    assert lines[0] == "broken (rlcore-broken 0.3.0): failed"
    assert lines[1].startswith("  ! ModuleNotFoundError: No module named 'sglang'")
    assert all(len(line) <= 80 for line in lines) and len(lines) > 2
