"""What crosses between roles is engine-neutral: built from Python's, torch's, numpy's and rlcore core's
own types, so a role running another transformers (or without a plugin's classes) can read it.

:func:`foreign_types` pickles a value the way Ray does (cloudpickle) into nothing and records the module
of every class and function the pickle refers to by name. With ``RLCORE_WIRE_AUDIT=1`` every Ray call of
a role checks its arguments (on the driver) and its result or error (in the worker) and raises
:class:`ForeignData` on anything else: the suite's runs across two environments turn it on.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

#: Set to 1 to check every value crossing a role's Ray calls (forwarded to workers as ``RLCORE_*``).
AUDIT_ENV = "RLCORE_WIRE_AUDIT"
#: Top-level modules whose types any role can unpickle: the interpreter's, torch, numpy and rlcore core
#: (``rlcore``, never a plugin's ``rlcore_*``); ``ray`` for object references.
NEUTRAL_ROOTS = frozenset(
    {
        "builtins",
        "collections",
        "copyreg",
        "_codecs",
        "pickle",
        "datetime",
        "enum",
        "functools",
        "pathlib",
        "re",
    }
    | {"numpy", "torch", "rlcore", "ray", "attr", "_operator", "operator", "math", "array", "typing"}
)


class ForeignData(TypeError):
    """A value crossing between roles refers to a type outside :data:`NEUTRAL_ROOTS`."""


def auditing() -> bool:
    return os.environ.get(AUDIT_ENV) == "1"


def foreign_types(value: Any) -> set[str]:
    """``module.qualname`` of each class or function ``value``'s pickle names outside
    :data:`NEUTRAL_ROOTS` (empty: the value is engine-neutral)."""
    import cloudpickle

    found: set[str] = set()

    class _Recorder(cloudpickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            named = (
                obj if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__") else type(obj)
            )
            module = getattr(named, "__module__", None) or ""
            if module.split(".")[0] not in NEUTRAL_ROOTS:
                found.add(f"{module}.{getattr(named, '__qualname__', named)}")
            if type(obj).__module__.startswith("ray") and type(obj).__name__ == "ObjectRef":
                return id(obj)  # a reference: what it points to crosses (and is checked) on its own
            return None

    _Recorder(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return found


def check_neutral(value: Any, what: str) -> None:
    """Raise :class:`ForeignData` naming ``what`` and the foreign types if ``value`` is not neutral."""
    foreign = foreign_types(value)
    if foreign:
        raise ForeignData(
            f"{what} carries types of a plugin or library ({', '.join(sorted(foreign))}): what crosses between "
            "roles must be rlcore core's types, tensors and plain data, so a role in another environment can "
            "read it (docs/environments.md)"
        )
