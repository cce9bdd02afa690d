"""Built-in sandboxes (default plugin): ``local`` (a limited child process on this machine) and ``http``
(a SandboxFusion-style service). Targets are lazy strings, so loading plugins imports neither."""

from __future__ import annotations

from rlcore import hookimpl


@hookimpl
def register_sandboxes(register):
    register("local", "rlcore.sandbox.local:LocalSandbox")
    register("http", "rlcore.sandbox.http:HttpSandbox")
