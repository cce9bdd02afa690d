"""Whether this machine has an Ascend NPU, answered without importing torch_npu.

Importing torch_npu loads the CANN runtime (seconds, and it fails loudly where CANN is missing), so
detection, which every rlcore process runs, only looks: is the ``torch_npu`` package installed, and does
the Ascend driver expose device nodes (``/dev/davinci0``, ``/dev/davinci1`` ...; the driver's
``davinci_manager`` node has no number). torch_npu itself is imported when an NPU engine is built.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import re

#: Where the Ascend driver puts one node per NPU.
DEVICE_GLOB = "/dev/davinci*"
_DEVICE_NODE = re.compile(r"davinci(\d+)$")


def torch_npu_installed() -> bool:
    return importlib.util.find_spec("torch_npu") is not None


def device_nodes() -> list[str]:
    """The NPU device nodes on this machine, in index order."""
    nodes = [p for p in glob.glob(DEVICE_GLOB) if _DEVICE_NODE.search(os.path.basename(p))]
    return sorted(nodes, key=lambda p: int(_DEVICE_NODE.search(p).group(1)))


def npu_present() -> bool:
    return torch_npu_installed() and bool(device_nodes())


def explain() -> str:
    if not torch_npu_installed():
        return "torch_npu is not installed; on an Ascend machine with CANN: pip install 'rlcore-ascend[npu]'"
    try:
        version = importlib.metadata.version("torch-npu")
    except importlib.metadata.PackageNotFoundError:
        version = "(version unknown)"
    nodes = device_nodes()
    if not nodes:
        return f"torch_npu {version} is installed but this machine has no Ascend NPU ({DEVICE_GLOB} absent)"
    return f"{len(nodes)} Ascend NPU device node(s), torch_npu {version}"
