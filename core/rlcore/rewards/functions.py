"""Finding scoring functions: by data source in the ``reward_functions`` registry, or in a user's file.

Every scoring function has verl's signature::

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict

returning a number, or a dict whose ``score`` is the number and whose other keys are logged per sample.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from rlcore.rewards.errors import RewardError

ScoreFn = Callable[..., Any]


def known_data_sources() -> list[str]:
    """Data sources that have a registered scorer (built-in or from plugins)."""
    from rlcore.plugins import registry

    return registry("reward_functions").names()


def reward_function_for(data_source: str) -> ScoreFn:
    """The scorer registered for ``data_source``; a clear error listing known data sources otherwise."""
    from rlcore.plugins import registry
    from rlcore.plugins.registries import RegistryError

    functions = registry("reward_functions")
    if data_source not in functions:
        failed = "".join(
            f"\nPlugin {name!r} failed to load, which may be why:\n{error}"
            for name, error in functions.failed_plugins.items()
        )
        raise RewardError(
            f"no reward function for data source {data_source!r}. Known data sources: "
            f"{', '.join(functions.names()) or '(none)'}. Set reward.custom_function_path to a file with "
            "compute_score(data_source, solution_str, ground_truth, extra_info), or register one from a plugin "
            f"(hook register_reward_functions).{failed}"
        )
    try:
        return functions.get(data_source)
    except RegistryError as exc:
        raise RewardError(str(exc)) from exc


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> Any:
    """Score with the scorer registered for ``data_source`` (verl's ``default_compute_score``).

    A user function can fall back to it for the data sources it does not handle itself.
    """
    fn = reward_function_for(data_source)
    return fn(
        data_source=data_source,
        solution_str=solution_str,
        ground_truth=ground_truth,
        extra_info=extra_info,
        **kwargs,
    )


def load_reward_function(path: str | os.PathLike, name: str = "compute_score") -> ScoreFn:
    """Import the Python file ``path`` and return its function ``name`` (verl's ``custom_reward_function``).

    The module is registered in ``sys.modules`` under a name derived from the file's absolute path, so
    dataclasses and pickling inside it work and loading the same file twice runs it once per process.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise RewardError(
            f"reward function file {path!r} does not exist (reward.custom_function_path). "
            "Give the path of a .py file, absolute or relative to the working directory."
        )
    module_name = "rlcore_user_reward_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise RewardError(
                f"reward function file {path!r} cannot be imported as Python (is it a .py file?)"
            )
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            del sys.modules[module_name]
            if isinstance(exc, KeyboardInterrupt):
                raise
            detail = "".join(traceback.format_exception(exc)).rstrip()
            raise RewardError(f"reward function file {path!r} failed to import:\n{detail}") from exc
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        defined = sorted(
            attr
            for attr, value in vars(module).items()
            if not attr.startswith("_")
            and callable(value)
            and getattr(value, "__module__", None) == module_name
        )
        what = "has no attribute" if fn is None else f"has a non-callable {type(fn).__name__}"
        raise RewardError(
            f"reward function file {path!r} {what} {name!r} (reward.custom_function_name). Callables it "
            f"defines: {', '.join(defined) if defined else '(none)'}."
        )
    return fn
