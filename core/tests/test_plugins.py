"""Plugin loading (rlcore.plugins) and registries (rlcore.plugins.registries), with in-memory plugin modules
behind stand-in entry points; tests/test_plugin_discovery.py does the same with installed packages."""

import sys
import types

import pytest
import rlcore
from rlcore import plugins
from rlcore.plugins import PluginManager, get_plugin_manager, registry, reset_plugins
from rlcore.plugins.registries import Registry, RegistryError


class FakeEntryPoint:
    """What PluginManager reads from an ``importlib.metadata.EntryPoint``."""

    def __init__(self, name, module, dist=None, version="1.0"):
        self.name, self.value = name, getattr(module, "__name__", f"{name}_pkg.plugin")
        self.dist = types.SimpleNamespace(name=dist or f"rlcore-{name}", version=version)
        self._module = module

    def load(self):
        if isinstance(self._module, Exception):
            raise self._module
        return self._module


def plugin_module(name, api=1, **hooks):
    """A module object with ``RLCORE_PLUGIN_API`` and the given hook implementations."""
    module = types.ModuleType(f"fake_plugin_{name}")
    if api is not None:
        module.RLCORE_PLUGIN_API = api
    for hook_name, fn in hooks.items():
        fn.__name__ = hook_name
        setattr(module, hook_name, rlcore.hookimpl(fn))
    return module


def engines(*names):
    def register_train_engines(register):
        for name in names:
            register(name, f"{name}_pkg.engine:Engine")

    return register_train_engines


@pytest.fixture
def install(monkeypatch):
    """``install(*entry_points)``: the entry points PluginManager sees; returns a fresh manager factory."""
    monkeypatch.delenv(plugins.LOAD_ENV, raising=False)
    monkeypatch.delenv(plugins.BLOCK_ENV, raising=False)

    def install_(*eps):
        fake_md = types.SimpleNamespace(entry_points=lambda group: [ep for ep in eps if group == "rlcore"])
        monkeypatch.setattr(plugins, "md", fake_md)
        return PluginManager

    return install_


def test_a_good_plugin_loads_and_registers(install):
    manager = install(FakeEntryPoint("good", plugin_module("good", register_train_engines=engines("good"))))()
    info = manager.plugins["good"]
    assert (info.status, info.error, info.distribution, info.version) == (
        "loaded",
        None,
        "rlcore-good",
        "1.0",
    )
    assert info.module == "fake_plugin_good" and not info.builtin
    assert info.registers == {"train_engines": ["good"]}
    assert manager.registries["train_engines"].entry("good").target == "good_pkg.engine:Engine"
    assert manager.registries["train_engines"].entry("good").plugin == "good"
    # the built-ins load through the same hooks
    assert manager.plugins["rlcore.testing.plugin"].registers == {
        "train_engines": ["fake"],
        "rollout_engines": ["fake"],
        "device_platforms": ["fake"],
    }


def test_import_failure_is_reported_and_others_load(install):
    manager = install(
        FakeEntryPoint("broken", ImportError("No module named 'torch_npu'")),
        FakeEntryPoint("good", plugin_module("good", register_train_engines=engines("good"))),
    )()
    broken = manager.plugins["broken"]
    assert broken.status == "failed" and broken.registers == {}
    assert "ImportError: No module named 'torch_npu'" in broken.error
    assert manager.plugins["good"].status == "loaded"
    with pytest.raises(RegistryError) as exc:
        manager.registries["train_engines"].get("broken")
    message = str(exc.value)
    assert "unknown train engine 'broken'" in message
    assert (
        "Plugin 'broken' is installed but failed to load, which is why" in message
        and "No module named 'torch_npu'" in message
    )


@pytest.mark.parametrize(
    ("api", "expected"),
    [
        (None, "does not declare RLCORE_PLUGIN_API, the range of rlcore plugin API versions it supports"),
        (
            99,
            f"supports rlcore plugin API >=99.0,<100, but rlcore 0.1.0 provides API {rlcore.API_VERSION}, so it was not loaded",
        ),
        (">=0.1,<1", "The plugin was built for an older API: upgrade it (`" + sys.executable + " -m pip"),
        ("1", "sets RLCORE_PLUGIN_API = '1', which is not a version range; write one such as"),
        (1.5, "sets RLCORE_PLUGIN_API = 1.5; it must be a version range"),
    ],
)
def test_plugin_api_version_is_checked(install, api, expected):
    module = plugin_module("old", api=api, register_train_engines=engines("old"))
    manager = install(FakeEntryPoint("old", module))()
    info = manager.plugins["old"]
    assert info.status == "failed" and expected in info.error
    assert "old" not in manager.registries["train_engines"]


def test_hook_raising_fails_that_plugin_and_takes_back_its_registrations(install):
    def register_rollout_engines(register):
        raise ValueError("bad rollout config class")

    flaky = plugin_module(
        "flaky", register_train_engines=engines("flaky"), register_rollout_engines=register_rollout_engines
    )
    manager = install(
        FakeEntryPoint("flaky", flaky),
        FakeEntryPoint("good", plugin_module("good", register_train_engines=engines("good"))),
    )()
    info = manager.plugins["flaky"]
    assert info.status == "failed" and "ValueError: bad rollout config class" in info.error
    # its train engine was registered by an earlier hook, then taken back with the plugin
    assert "flaky" not in manager.registries["train_engines"] and info.registers == {}
    assert manager.registries["train_engines"].names() == ["fake", "good"]
    with pytest.raises(RegistryError, match="Plugin 'flaky' is installed but failed to load"):
        manager.registries["train_engines"].get("flaky")


def test_a_name_registered_by_two_plugins(install):
    manager = install(
        FakeEntryPoint("beta", plugin_module("beta", register_train_engines=engines("dup", "beta_only"))),
        FakeEntryPoint("alpha", plugin_module("alpha", register_train_engines=engines("dup"))),
        FakeEntryPoint("hijack", plugin_module("hijack", register_train_engines=engines("fake"))),
    )()
    # entry points load in name order: alpha keeps "dup", beta fails as a whole
    assert manager.registries["train_engines"].entry("dup").plugin == "alpha"
    assert manager.plugins["beta"].status == "failed"
    assert (
        "train engine 'dup' is registered twice: by plugin 'alpha' and by plugin 'beta'"
        in manager.plugins["beta"].error
    )
    assert "beta_only" not in manager.registries["train_engines"]
    # a built-in name cannot be taken over: built-ins register first
    assert manager.registries["train_engines"].entry("fake").plugin == "rlcore.testing.plugin"
    assert "by plugin 'rlcore.testing.plugin' and by plugin 'hijack'" in manager.plugins["hijack"].error


def test_misspelt_hook_name_fails_that_plugin_only(install):
    typo = plugin_module("typo", register_train_engine=engines("typo"))
    manager = install(
        FakeEntryPoint("typo", typo),
        FakeEntryPoint("good", plugin_module("good", register_train_engines=engines("good"))),
    )()
    info = manager.plugins["typo"]
    assert info.status == "failed"
    assert (
        "implements 'register_train_engine', which is not an rlcore hook. Did you mean 'register_train_engines'?"
        in info.error
    )
    assert manager.plugins["good"].status == "loaded"
    assert not manager.pm.has_plugin("typo")
    manager.pm.check_pending()  # nothing unspecified is left registered


def test_hook_with_wrong_argument_name_fails_that_plugin(install):
    def register_train_engines(reg):  # the spec's argument is ``register``
        reg("wrong", object)

    manager = install(
        FakeEntryPoint("wrongarg", plugin_module("wrongarg", register_train_engines=register_train_engines))
    )()
    info = manager.plugins["wrongarg"]
    assert (
        info.status == "failed" and "reg" in info.error and "wrong" not in manager.registries["train_engines"]
    )


def test_load_and_block_environment_variables(install, monkeypatch):
    eps = [
        FakeEntryPoint(name, plugin_module(name, register_train_engines=engines(name)), dist=f"dist-{name}")
        for name in ("a", "b", "c")
    ]
    make = install(*eps)

    def statuses():
        return {n: i.status for n, i in make().plugins.items() if not i.builtin}

    assert statuses() == {"a": "loaded", "b": "loaded", "c": "loaded"}
    monkeypatch.setenv("RLCORE_LOAD_PLUGINS", "a, dist-c")  # entry-point or distribution names
    assert statuses() == {"a": "loaded", "b": "not selected", "c": "loaded"}
    manager = make()
    assert manager.plugins["b"].error == "not listed in RLCORE_LOAD_PLUGINS='a, dist-c'"
    assert manager.registries["train_engines"].names() == ["a", "c", "fake"]
    monkeypatch.setenv("RLCORE_LOAD_PLUGINS", "")
    assert set(statuses().values()) == {"not selected"}
    assert make().plugins["rlcore.testing.plugin"].status == "loaded"  # built-ins always load
    monkeypatch.delenv("RLCORE_LOAD_PLUGINS")
    monkeypatch.setenv("RLCORE_BLOCK_PLUGINS", "dist-b")
    assert statuses() == {"a": "loaded", "b": "blocked", "c": "loaded"}
    monkeypatch.setenv("RLCORE_LOAD_PLUGINS", "a,b")  # block wins over load
    assert statuses() == {"a": "loaded", "b": "blocked", "c": "not selected"}
    assert make().plugins["b"].error == "blocked by RLCORE_BLOCK_PLUGINS='dist-b'"


def test_a_broken_builtin_is_an_rlcore_bug_and_raises(install, monkeypatch):
    def register_train_engines(register):
        raise RuntimeError("built-in bug")

    module = plugin_module("builtin", register_train_engines=register_train_engines)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(plugins, "DEFAULT_PLUGINS", (*plugins.DEFAULT_PLUGINS, module.__name__))
    with pytest.raises(RuntimeError, match="built-in bug"):
        install()()


def test_installed_plugins_and_reset(monkeypatch):
    """The real entry points of this environment: core's plugins are installed and load."""
    monkeypatch.delenv(plugins.LOAD_ENV, raising=False)
    monkeypatch.delenv(plugins.BLOCK_ENV, raising=False)
    reset_plugins()
    try:
        manager = get_plugin_manager()
        assert get_plugin_manager() is manager  # loaded once per process
        assert (
            manager.plugins["fsdp"].status == "loaded"
            and manager.plugins["fsdp"].distribution == "rlcore-fsdp"
        )
        assert "fsdp" in registry("train_engines") and "fake" in registry("rollout_engines")
        monkeypatch.setenv(plugins.LOAD_ENV, "")
        assert "fsdp" in registry("train_engines")  # still the old manager
        reset_plugins()
        assert "fsdp" not in registry("train_engines")
        assert get_plugin_manager().plugins["fsdp"].status == "not selected"
    finally:
        monkeypatch.delenv(plugins.LOAD_ENV, raising=False)
        reset_plugins()


# -- Registry ------------------------------------------------------------------------------------
def test_registry_lookup_messages():
    reg = Registry("train engine", "pip install rlcore-{name}")
    reg.register("fsdp", object, plugin="fsdp")
    reg.register("megatron", object, plugin="megatron")
    with pytest.raises(RegistryError) as exc:
        reg.get("fsdpp")
    assert str(exc.value) == "unknown train engine 'fsdpp'. Installed: fsdp, megatron.\nDid you mean 'fsdp'?"
    with pytest.raises(RegistryError) as exc:
        reg.get("deepspeed")
    assert str(exc.value) == (
        "unknown train engine 'deepspeed'. Installed: fsdp, megatron.\n"
        "If it is published as a plugin, install it: pip install rlcore-deepspeed"
    )
    with pytest.raises(RegistryError, match="non-empty strings"):
        reg.register("", object, plugin="x")
    with pytest.raises(RegistryError, match="registered twice: by plugin 'fsdp' and by plugin 'other'"):
        reg.register("fsdp", object, plugin="other")
    assert reg.remove_plugin("megatron") == ["megatron"] and reg.names() == ["fsdp"]


def test_lazy_entry_import_failure_names_plugin_and_target():
    reg = Registry("rollout engine")
    reg.register("ghost", "rlcore_no_such_module.engine:Ghost", plugin="ghost-plugin")
    with pytest.raises(RegistryError) as exc:
        reg.get("ghost")
    assert (
        "'ghost' (from plugin 'ghost-plugin') could not be imported from 'rlcore_no_such_module.engine:Ghost'"
        in str(exc.value)
    )
    assert "ModuleNotFoundError" in str(exc.value)
    reg.register("json", "json:dumps", plugin="p")
    import json

    assert reg.get("json") is json.dumps


def test_lookup_miss_quotes_failed_plugins():
    reg = Registry("train engine", "pip install rlcore-{name}")
    reg.register("fsdp", object, plugin="fsdp")
    reg.failed_plugins["npu"] = "ImportError: libascend.so not found"
    reg.failed_plugins["other"] = "ValueError: bad"
    message = str(pytest.raises(RegistryError, reg.get, "npu").value)
    # the failed plugin named like the engine is the reason; no install advice for an installed plugin
    assert (
        "Plugin 'npu' is installed but failed to load, which is why:\n  ImportError: libascend.so" in message
    )
    assert "'other'" not in message and "pip install" not in message
    message = str(pytest.raises(RegistryError, reg.get, "deepspeed").value)
    assert "Plugin 'npu' is installed but failed to load, which may be why" in message
    assert "Plugin 'other'" in message and "pip install rlcore-deepspeed" in message
    assert "`rlcore plugins` shows the full traceback" in message
    message = str(pytest.raises(RegistryError, reg.get, "fsdpp").value)
    assert message == "unknown train engine 'fsdpp'. Installed: fsdp.\nDid you mean 'fsdp'?"


def test_lookup_miss_quotes_the_one_line_error_with_its_location(install):
    def register_train_engines(register):
        raise KeyError("missing config key")

    manager = install(
        FakeEntryPoint("kaput", plugin_module("kaput", register_train_engines=register_train_engines))
    )()
    message = str(pytest.raises(RegistryError, manager.registries["train_engines"].get, "kaput").value)
    line = message.splitlines()[2]
    assert line.startswith("  KeyError: 'missing config key' (") and __file__ in line
    assert "Traceback" in manager.plugins["kaput"].error  # the full traceback stays in PluginInfo
