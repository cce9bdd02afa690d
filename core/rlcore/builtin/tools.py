"""Built-in agent tools (default plugin): the calculator and the Python interpreter.

Targets are lazy ``"module:attribute"`` strings, so loading plugins imports no tool module.
"""

from __future__ import annotations

from rlcore import hookimpl


@hookimpl
def register_tools(register):
    register("calculator", "rlcore.agents.builtin_tools:Calculator")
    register("python", "rlcore.agents.builtin_tools:PythonInterpreter")
