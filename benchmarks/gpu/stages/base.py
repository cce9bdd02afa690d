"""A stage: one named piece of GPU work that produces rows of docs/benchmarks.md."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..actions import Ctx
from ..bundles import BUNDLES
from ..device import PROJ


@dataclass(frozen=True)
class Stage:
    name: str
    doc: str
    #: The benchmark script (or test file) it runs, relative to the checkout.
    script: str
    #: Rough wall seconds on a warm machine: the plan chains stages that do not fit one call.
    seconds: int
    build: Callable[[Ctx], list]
    #: Bundles unpacked before it runs; their sites follow /tmp/proj on PYTHONPATH in this order.
    bundles: tuple[str, ...] = ()
    gpus: int = 1
    #: Needs an H200's memory (the 7B pair peaked at 109 GiB a GPU).
    h200: bool = False
    #: Needs the project installed into /tmp/proj (pip --no-deps --no-index --target).
    project: bool = True
    #: PYTHONPATH when it is not /tmp/proj and the bundles' sites.
    path: tuple[str, ...] | None = None
    #: Environment every process of the stage gets besides its bundles'.
    env_extra: dict[str, str] | None = None

    @property
    def kind(self) -> str:
        """The device kind to ask for."""
        if self.gpus == 1:
            return "nvidia-h200" if self.h200 else "nvidia-h100-x1"
        return f"nvidia-h200-x{self.gpus}" if self.h200 else f"nvidia-h100-x{self.gpus}"

    def pythonpath(self) -> tuple[str, ...]:
        if self.path is not None:
            return self.path
        sites = tuple(BUNDLES[b].site for b in self.bundles)
        return ((PROJ,) if self.project else ()) + sites

    def env(self) -> dict[str, str]:
        env = {"TOKENIZERS_PARALLELISM": "false"}
        for b in self.bundles:
            env.update(BUNDLES[b].env)
        env.update(self.env_extra or {})
        return env
