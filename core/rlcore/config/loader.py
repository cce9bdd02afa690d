"""Loading a run's config: defaults <- built-in task (when no training files are given: see
:mod:`rlcore.tasks`) <- YAML file <- dotted ``key=value`` overrides, then validation.

Everything is checked before anything starts: unknown keys (with the full key path, the valid keys and
the closest match), wrong types, failed value checks and missing required values (``???``).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import cattrs
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlcore.config.auto import choose_rollout, resolve_layout
from rlcore.config.names import NAMED_KEYS, check_names, name_error
from rlcore.config.schema import FieldValueError, RLConfig
from rlcore.envs.spec import config_errors as environment_errors
from rlcore.plugins import registry
from rlcore.tasks import with_task_recipe


class ConfigError(ValueError):
    """The config is invalid; the message names every offending key path and what is allowed."""


def invalid_config(errors: Sequence[str]) -> ConfigError:
    """The error for ``errors`` (one message per key): a single one on the first line, where a terminal
    shows it first; several as a list."""
    if len(errors) == 1:
        return ConfigError(f"invalid config: {errors[0]}")
    return ConfigError("invalid config:\n  " + "\n  ".join(errors))


# -- strict structuring -----------------------------------------------------------------------------
def _strict(kind: type, accept: tuple[type, ...]):
    def structure(value: Any, _type: type) -> Any:
        # bool is an int subclass; "1" is not an int: a config must say what it means.
        if isinstance(value, bool) and kind is not bool or not isinstance(value, accept):
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
        return kind(value)

    return structure


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(int, _strict(int, (int,)))
    converter.register_structure_hook(float, _strict(float, (int, float)))
    converter.register_structure_hook(bool, _strict(bool, (bool,)))
    converter.register_structure_hook(str, _strict(str, (str,)))
    # A bound that may also be the word "auto" (transport.max_logprob_diff): numbers become floats.
    converter.register_structure_hook_func(
        lambda t: t == (float | str | None),
        lambda v, _t: v if v is None or isinstance(v, str) else _strict(float, (int, float))(v, float),
    )
    # A switch or a count that may also be the word "auto" (plugin sections: fsdp.compile, ...).
    converter.register_structure_hook_func(
        lambda t: t == (bool | str),
        lambda v, _t: v if isinstance(v, str) else _strict(bool, (bool,))(v, bool),
    )
    converter.register_structure_hook_func(
        lambda t: t == (int | str),
        lambda v, _t: v if isinstance(v, str) else _strict(int, (int,))(v, int),
    )
    # verl scripts write `data.train_files=a.parquet`: a single path means a list of one.
    converter.register_structure_hook_func(
        lambda t: t == list[str],
        lambda v, _t: [_strict(str, (str,))(x, str) for x in ([v] if isinstance(v, str) else v)],
    )
    return converter


CONVERTER = _make_converter()


# -- plugin sections ------------------------------------------------------------------------------
def plugin_sections(engine: str, rollout: str) -> dict[str, type]:
    """Config classes of the selected train and rollout engines, keyed by section name."""
    sections: dict[str, type] = {}
    for key, name in (("train_engines", engine), ("rollout_engines", rollout)):
        config_class = registry(key).entry(name).options.get("config")
        if config_class is not None:
            sections[name] = config_class
    return sections


def _all_sections() -> dict[str, tuple[str, type]]:
    """Every installed plugin section: name -> (registry key, class)."""
    found: dict[str, tuple[str, type]] = {}
    for key in ("train_engines", "rollout_engines"):
        for entry in registry(key).entries():
            if entry.options.get("config") is not None:
                found.setdefault(entry.name, (key, entry.options["config"]))
    return found


def resolve_rollout(name: str, device: str = "auto", ray_address: str | None = None) -> str:
    """``auto``: the choice of ``device``'s platform (:func:`rlcore.config.auto.choose_rollout`)."""
    return choose_rollout(name, device, ray_address)[0]


# -- unknown keys ---------------------------------------------------------------------------------
def _unknown_keys(data: Any, cls: type, path: str, errors: list[str]) -> None:
    if not isinstance(data, dict) or not attrs.has(cls):
        return
    attrs.resolve_types(cls)  # annotations are strings under `from __future__ import annotations`
    fields = {f.name: f for f in attrs.fields(cls)}
    for key, value in data.items():
        full = f"{path}.{key}" if path else str(key)
        if key not in fields:
            errors.append(_unknown_message(full, str(key), sorted(fields)))
            continue
        field_type = fields[key].type
        if isinstance(field_type, type) and attrs.has(field_type):
            _unknown_keys(value, field_type, full, errors)


def _unknown_message(full: str, key: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    parent = full.rpartition(".")[0]
    hint = f" Did you mean '{parent + '.' if parent else ''}{close[0]}'?" if close else ""
    return f"unknown key '{full}'.{hint} Valid keys{' under ' + repr(parent) if parent else ''}: {', '.join(valid)}."


# -- loading --------------------------------------------------------------------------------------
def _read_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping of sections at the top level "
            f"(trainer:, data:, ...), got {type(data).__name__}"
        )
    # Parsed again by omegaconf, whose YAML loader reads `1e-6` as a float (PyYAML reads a string).
    return OmegaConf.load(path)


def merge_sources(
    config_file: str | Path | None = None,
    overrides: Sequence[str] = (),
    engine: str | None = None,
    rollout: str | None = None,
) -> dict[str, Any]:
    """The user's raw settings (file, then overrides, then ``--engine``/``--rollout``) as a plain dict."""
    conf = OmegaConf.create({})
    if config_file is not None:
        conf = OmegaConf.merge(conf, _read_yaml(config_file))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value")
        try:
            conf = OmegaConf.merge(conf, OmegaConf.from_dotlist([item]))
        except Exception as exc:  # omegaconf and its YAML parser raise several unrelated types
            raise ConfigError(f"override {item!r} could not be applied: {exc}") from exc
    if engine is not None:
        conf = OmegaConf.merge(conf, {"engine": engine})
    if rollout is not None:
        conf = OmegaConf.merge(conf, {"rollout": {"engine": rollout}})
    try:
        return OmegaConf.to_container(conf, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ConfigError(f"missing or unresolvable value at key '{key}': {exc.msg}") from exc


def defaults(engine: str = "fsdp", rollout: str = "auto") -> dict[str, Any]:
    """The default config, with the selected engines' plugin sections, as a plain dict."""
    return to_dict(
        RLConfig(
            engine=engine,
            plugins={name: cls() for name, cls in plugin_sections(engine, resolve_rollout(rollout)).items()},
        )
    )


def load_config(
    config_file: str | Path | None = None,
    overrides: Sequence[str] = (),
    engine: str | None = None,
    rollout: str | None = None,
    notes: list[str] | None = None,
) -> RLConfig:
    """Resolve and validate a run's config. Raises :class:`ConfigError` listing every problem. ``notes``,
    when given, receives a line for each ``auto`` value resolved here, saying what it became and why."""
    # A run without training files trains on the built-in task, whose settings lie under the user's.
    raw = with_task_recipe(merge_sources(config_file, overrides, engine, rollout))
    engine_name = raw.get("engine", RLConfig().engine)
    trainer_raw = raw.get("trainer") if isinstance(raw.get("trainer"), dict) else {}
    rollout_name, why_rollout = choose_rollout(
        (raw.get("rollout") or {}).get("engine", "auto"),
        trainer_raw.get("device", "auto"),
        trainer_raw.get("ray_address"),
    )
    engines = {"engine": engine_name, "rollout.engine": rollout_name}
    # Checked first: the selected engines decide which plugin sections exist. An unknown engine has no
    # section; its error is reported with the unknown keys, and a value of the wrong type by the type check.
    errors = [e for key, value in engines.items() if (e := name_error(key, value)) is not None]
    selectable = not errors and all(isinstance(v, str) for v in engines.values())
    sections = plugin_sections(engine_name, rollout_name) if selectable else {}
    installed = _all_sections()

    core_keys = [f.name for f in attrs.fields(RLConfig) if f.name != "plugins"]
    plugin_data: dict[str, Any] = {}
    core_data: dict[str, Any] = {}
    for key, value in raw.items():
        if key in core_keys:
            core_data[key] = value
        elif key in sections or key in installed:
            plugin_data[key] = value
        else:
            errors.append(_unknown_message(key, key, core_keys + sorted(installed)))
    _unknown_keys(core_data, RLConfig, "", errors)
    for name, value in plugin_data.items():
        cls = sections.get(name) or installed[name][1]
        _unknown_keys(value, cls, name, errors)
    if errors:
        raise invalid_config(errors)

    core_data["rollout"] = {**core_data.get("rollout", {}), "engine": rollout_name}
    config = _structure(core_data, RLConfig, "")
    for name, cls in sections.items():
        config.plugins[name] = _structure(plugin_data.get(name, {}), cls, name)
    for name, value in plugin_data.items():
        if name not in sections:  # an installed but unselected plugin's section: still type-checked
            config.plugins[name] = _structure(value, installed[name][1], name)
    # The other component names, once their values are known to be strings (or None).
    errors = check_names(config, tuple(key for key in NAMED_KEYS if key not in engines))
    errors += [e for name in sections for e in _run_errors(config.plugins[name], config)]
    if errors:
        raise invalid_config(errors)
    config, layout_notes = resolve_layout(config, rollout_name)
    env_errors = environment_errors(config)
    if env_errors:
        raise invalid_config(env_errors)
    if notes is not None:
        notes.extend([why_rollout, *layout_notes])
    return config


def _run_errors(section: Any, config: RLConfig) -> list[str]:
    """A selected plugin section's checks against the rest of the run's config: its optional
    ``check_run(config) -> list[str]`` (one message per problem, naming the key paths), e.g. Megatron's
    parallel sizes against ``actor.world_size``. Here, so the run stops before any worker starts."""
    check = getattr(section, "check_run", None)
    return list(check(config)) if callable(check) else []


def _structure(data: Any, cls: type, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"'{path or 'config'}' must be a mapping, got {type(data).__name__} {data!r}")
    try:
        return CONVERTER.structure(data, cls)
    except Exception as exc:
        lines = [_rewrite(line, path) for line in cattrs.transform_error(exc, "$", _describe)]
        raise invalid_config(lines) from None


def _describe(exc: BaseException, _type: Any) -> str:
    """The validator's or type check's own words (cattrs' default says only "invalid value")."""
    if isinstance(exc, FieldValueError):
        return f"{exc.field}\0{exc}"
    if isinstance(exc, KeyError):
        return f"required value missing: {exc}"
    return str(exc) or type(exc).__name__


def _rewrite(line: str, prefix: str) -> str:
    """cattrs says ``... @ $.trainer.total_steps``; say ``trainer.total_steps: ...`` instead."""
    message, _, where = line.rpartition(" @ ")
    key = where.removeprefix("$").lstrip(".")
    field, sep, text = message.partition("\0")
    if sep:
        key, message = f"{key}.{field}" if key else field, text
    key = ".".join(k for k in (prefix, key) if k)
    return f"'{key or 'config'}': {message or line}"


def to_dict(config: RLConfig) -> dict[str, Any]:
    """Plain nested dict, plugin sections at the top level (the shape the YAML file has)."""
    data = CONVERTER.unstructure(config)
    data.pop("plugins")
    for name, section in config.plugins.items():
        data[name] = CONVERTER.unstructure(section)
    return _plain(data)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def to_yaml(config: RLConfig | dict[str, Any]) -> str:
    data = to_dict(config) if isinstance(config, RLConfig) else config
    return OmegaConf.to_yaml(OmegaConf.create(data))
