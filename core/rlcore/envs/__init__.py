"""Roles in Python environments of their own: a rollout engine that pins another transformers (SGLang)
runs its Ray workers with another interpreter, while the trainer stays on the driver's.

An environment is an **overlay** on the driver's: a venv whose own ``site-packages`` (the environment's
requirements, installed by pip) comes first on ``sys.path``, and the driver's ``site-packages`` after it,
so torch, Ray and rlcore are shared and only what the requirements change is shadowed. It is built once per
node (``rlcore env build NAME``) under that node's :func:`~rlcore.envs.spec.env_home`, in a folder named
by a hash of its requirements, and found again by that hash: a changed requirement is a new environment.

- :mod:`rlcore.envs.config`: the ``environments:`` config section (which role runs where, named
  environments' requirements);
- :mod:`rlcore.envs.spec`: an environment's requirements, hash and folder;
- :mod:`rlcore.envs.overlay`: building one, and whether one on this node is ready;
- :mod:`rlcore.envs.nodes`: checking every Ray node before a run's workers start, and the interpreter a
  role's Ray workers start with.
"""

from rlcore.envs.config import ENV_ROLES, EnvironmentsConfig
from rlcore.envs.spec import EnvSpec, env_home, role_env_specs, spec_for

__all__ = ["ENV_ROLES", "EnvSpec", "EnvironmentsConfig", "env_home", "role_env_specs", "spec_for"]
