"""Suite-wide rule: the only tests `make test` may skip are those that need hardware this machine lacks.

CI runs on a CPU box with every package of `make setup` installed, so a skip there is either a GPU-only
test (marked ``gpu``, ``multigpu`` or ``npu``) or a test that silently stopped running: a console
script off ``PATH``, an optional package missing from the install, an engine that stopped declaring a
head. The second kind fails the session here, listed by name and reason, instead of hiding in the
``s`` of the summary line.
"""

from __future__ import annotations

import pytest

#: Markers of tests that need hardware; only these may be skipped.
HARDWARE_MARKERS = ("gpu", "multigpu", "npu")

_unexpected: list[tuple[str, str]] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.skipped and not any(item.get_closest_marker(m) for m in HARDWARE_MARKERS):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        _unexpected.append((item.nodeid, reason))
    return report


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if _unexpected:
        terminalreporter.section("skips that are not hardware-only", red=True)
        for nodeid, reason in _unexpected:
            terminalreporter.write_line(f"{nodeid}: {reason}")
        terminalreporter.write_line(
            "Only tests marked gpu/multigpu/npu may skip: install what is missing (make setup) or fix the "
            "test; a test that cannot run here must say why with a hardware marker."
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _unexpected and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
