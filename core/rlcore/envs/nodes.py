"""Before a run's workers start: every Ray node has each role's environment, or the run stops naming
the node, the role and the command that builds it; and the interpreter each role's workers start with.

A worker whose interpreter is missing never starts, and Ray retries it without an error: checked first,
so that never happens (NeMo-RL's missing environments zeroed rewards silently; here the run does not
start).
"""

from __future__ import annotations

import socket
from typing import Any

from rlcore.envs.overlay import PYTHON, status
from rlcore.envs.spec import DEFAULT_HOME, HOME_ENV, EnvSpec, env_home

#: Seconds the probes of all nodes may take (each starts a worker process with the driver's interpreter).
PROBE_TIMEOUT_S = 300.0


class EnvironmentMissing(RuntimeError):
    """A role's environment is missing, unfinished or stale on some node; one line per node and role."""


def py_executable(spec: EnvSpec) -> str:
    """The command Ray starts ``spec``'s workers with (``runtime_env["py_executable"]``): the environment's
    interpreter under the node's own ``RLCORE_ENV_HOME``, without ``PYTHONPATH`` (whose entries would
    come before the environment's own packages; the environment reads the driver's after them). Ray runs
    it through ``bash -c`` on that node, so the variable is that node's."""
    default = DEFAULT_HOME.replace("~", "$HOME", 1)
    return f'env -u PYTHONPATH "${{{HOME_ENV}:-{default}}}"/{spec.dirname}/{PYTHON}'


def _probe(specs: list[EnvSpec]) -> dict[str, Any]:
    """On one node: the status of each environment there."""
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "host": socket.gethostname(),
        "home": str(env_home()),
        "status": {spec.dirname: status(spec) for spec in specs},
    }


def check_nodes(role_specs: dict[str, EnvSpec], timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`EnvironmentMissing` unless every alive node of the connected Ray cluster has every
    environment of ``role_specs`` ({role: spec}) ready. Every node: Ray may place a role's workers on any."""
    if not role_specs:
        return
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    specs = list({spec.dirname: spec for spec in role_specs.values()}.values())
    probe = ray.remote(num_cpus=0, max_retries=0)(_probe)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    refs = {
        n["NodeManagerAddress"]: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(specs)
        for n in nodes
    }
    ready, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    if pending:
        late = [ip for ip, ref in refs.items() if ref in pending]
        raise EnvironmentMissing(
            f"checking the roles' environments: node(s) {', '.join(late)} did not answer within {timeout_s:.0f} s"
        )
    problems = []
    for ip, ref in refs.items():
        report = ray.get(ref)
        for role, spec in sorted(role_specs.items()):
            found = report["status"][spec.dirname]
            if found.ready:
                continue
            problems.append(
                f"role {role!r} runs in environment {spec.name!r} (environments.roles.{role}), which is "
                f"{found.state} on node {ip} (host {report['host']}, node id {report['node_id'][:12]}, "
                f"{HOME_ENV}={report['home']}): {found.detail}. Build it on that node: {spec.build_command()}"
            )
    if problems:
        raise EnvironmentMissing(
            "the run cannot start: " + ("\n" if len(problems) > 1 else "") + "\n".join(problems)
        )
