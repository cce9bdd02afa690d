"""The quiet terminal of a run (rlcore.telemetry.terminal), in a fresh process: what a library writes at any level
(Python print, C-level writes to the descriptors, warnings, logging) lands in the log file; the run's
own lines reach the real stdout; everything is restored afterwards."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import logging, os, sys, warnings
    from pathlib import Path
    from rlcore.telemetry.terminal import LOG_DIR_ENV, run_output

    run_dir = Path(sys.argv[1])
    with run_output(run_dir, "quiet") as terminal:
        print("library print")
        os.write(2, b"c-level stderr\\n")
        warnings.warn("a FutureWarning from a library", FutureWarning)
        logging.getLogger("somelib").info("library info record")
        terminal.write("step 1/1  reward 0.5\\n")
        print("workers get", os.environ[LOG_DIR_ENV], file=terminal)
    print("after the run", LOG_DIR_ENV in os.environ)
    """
)


def test_quiet_run_output_goes_to_the_log_file(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "step 1/1  reward 0.5",
        f"workers get {tmp_path / 'logs'}",
        "after the run False",
    ]
    assert proc.stderr == ""
    log = (tmp_path / "logs" / "driver.log").read_text()
    for line in ("library print", "c-level stderr", "a FutureWarning from a library", "library info record"):
        assert line in log


def test_other_levels_leave_the_terminal_alone(tmp_path):
    script = SCRIPT.replace('"quiet"', '"warning"').replace("os.environ[LOG_DIR_ENV]", "None")
    script = script.replace("terminal.write(", "sys.stdout.write(").replace("file=terminal", "")
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "library print" in proc.stdout and "c-level stderr" in proc.stderr
    assert not (tmp_path / "logs").exists()
