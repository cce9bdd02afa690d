"""The ``environments:`` config section: which roles run in which Python environment."""

from __future__ import annotations

import attrs

#: The roles that may run in an environment of their own (``reference`` follows the actor's engine but
#: may be placed apart).
ENV_ROLES = ("actor", "reference", "critic", "reward_model", "teacher", "rollout")


def _known_roles(instance, attribute, value: dict[str, str]) -> None:
    for role, name in value.items():
        if role not in ENV_ROLES:
            raise ValueError(
                f"environments.roles has role {role!r}; roles that can run in an environment: "
                f"{', '.join(ENV_ROLES)}"
            )
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"environments.roles.{role}: an environment is named by a non-empty string, got {name!r}"
            )


@attrs.define(kw_only=True)
class EnvironmentsConfig:
    """Which roles' Ray workers start with another interpreter (docs/environments.md).

    Default: every role in the driver's environment, as before. ``roles: {rollout: sglang}`` starts the
    rollout's workers in environment ``sglang``, which ``rlcore env build sglang`` makes on each node
    first; the run stops before step 1, naming the node, if one lacks it.
    """

    #: Role (``actor``, ``reference``, ``critic``, ``reward_model``, ``teacher``, ``rollout``) -> name of the
    #: environment its workers run in. A role not listed runs in the driver's environment.
    roles: dict[str, str] = attrs.field(factory=dict, validator=_known_roles)
    #: Environment name -> its pip requirements (``["transformers==5.12.1"]``). A name not listed here
    #: must be a plugin's (``sglang``): its environment is the one the plugin declares
    #: (``RLCORE_PLUGIN_ENV`` in its entry-point module; the plugin itself when it declares none).
    requirements: dict[str, list[str]] = attrs.field(factory=dict)
    #: Environment name -> folders of packages installed already (``pip install --target DIR``, an unpacked
    #: wheelhouse), read before the driver's packages: on a machine without a package index, pip then has
    #: nothing left to install. Each node needs them at the same paths.
    sites: dict[str, list[str]] = attrs.field(factory=dict)
