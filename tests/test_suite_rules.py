"""The suite-wide skip rule of the root ``conftest.py``, run on a small suite of its own: a skip of a
test without a hardware marker fails the session, a skipped GPU test does not."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_suite(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text("import pytest\n\n" + body)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )


def test_a_skip_without_a_hardware_marker_fails_the_session(tmp_path):
    result = run_suite(
        tmp_path,
        "def test_runs():\n    pass\n\n"
        "def test_quietly_gone():\n    pytest.skip('the console script is not on PATH')\n",
    )
    assert result.returncode == 1, result.stdout
    assert "skips that are not hardware-only" in result.stdout
    assert "test_sample.py::test_quietly_gone: the console script is not on PATH" in result.stdout


def test_a_skipped_gpu_test_is_fine(tmp_path):
    result = run_suite(
        tmp_path,
        "def test_runs():\n    pass\n\n"
        "@pytest.mark.gpu\n@pytest.mark.skipif(True, reason='needs a CUDA GPU')\n"
        "def test_on_gpu():\n    pass\n",
    )
    assert result.returncode == 0, result.stdout
    assert "1 passed, 1 skipped" in result.stdout
    assert "not hardware-only" not in result.stdout
