"""Make the installed torchvision importable on the CPU torch: its pure-Python transforms only.

The registry offers torchvision only as CUDA builds (``torchvision-0.28.0`` links ``libcudart`` and CUDA
torch symbols); their C ops cannot load on the CPU wheel of torch, and the package's ``__init__`` then
fails registering meta kernels for ``torchvision::nms``, which breaks ``import transformers``. The CPU
build (download.pytorch.org/whl/cpu) is not reachable from these machines.

transformers needs torchvision for the video processors that every Qwen-VL processor carries (and so
``AutoProcessor`` and vLLM's multimodal processing do), which use ``torchvision.transforms.v2``: Python on
torch tensors, no C ops. This script removes the CUDA libraries and C extensions from the installed
package and imports the two op-registration modules only when the ops loaded. Detection ops (``nms``,
``roi_align`` ...) and image decoding (``torchvision.io``) are unavailable; nothing in rlcore uses them.

    python tools/torchvision_python_only.py        # idempotent; make setup runs it
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

REGISTRATIONS = """from torchvision import (
    _autograd_registrations,
    _meta_registrations,
    datasets,"""
GUARDED = """if extension._has_ops():  # rlcore: C ops absent (tools/torchvision_python_only.py)
    from torchvision import _autograd_registrations, _meta_registrations  # noqa: F401
from torchvision import (
    datasets,"""


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("torchvision is not installed: nothing to do")
        return 0
    package = Path(spec.origin).parent
    removed = [p for p in (*package.glob("*.so"), package.parent / "torchvision.libs") if p.exists()]
    for path in removed:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    init = package / "__init__.py"
    text = init.read_text()
    if GUARDED not in text:
        if REGISTRATIONS not in text:
            print(
                f"{init}: unexpected layout (not torchvision 0.28?); pin torchvision in constraints-cpu.txt"
            )
            return 1
        init.write_text(text.replace(REGISTRATIONS, GUARDED))
    print(f"torchvision at {package}: Python only ({len(removed)} native parts removed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
