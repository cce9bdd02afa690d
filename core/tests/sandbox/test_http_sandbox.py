"""The http sandbox against a real SandboxFusion-style server in a thread (which runs the code with the
local sandbox), and against servers that fail: each failure is a result with status ``error``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from rlcore.sandbox import SandboxLimits, get_sandbox
from rlcore.sandbox.http import HttpSandbox
from rlcore.sandbox.local import LocalSandbox

_LOCAL = LocalSandbox()


def fusion_answer(request: dict[str, Any]) -> dict[str, Any]:
    """What SandboxFusion answers for ``request``, computed by running it in the local sandbox."""
    limits = SandboxLimits(
        wall_s=float(request["run_timeout"]),
        cpu_s=float(request["run_timeout"]),
        memory_mib=int(request["memory_limit_MB"]),
    )
    result = _LOCAL.run_sync(request["code"], stdin=request.get("stdin", ""), limits=limits)
    run_status = {"ok": "Finished", "timeout": "TimeLimitExceeded"}.get(result.status, "Error")
    return {
        "status": "Success" if result.ok else "Failed",
        "message": "",
        "compile_result": None,
        "run_result": {
            "status": run_status,
            "execution_time": result.wall_s,
            "return_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
        },
        "files": {},
    }


class Handler(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode, _, endpoint = self.path.strip("/").rpartition("/")
        assert endpoint == "run_code", self.path
        Handler.requests.append({"mode": mode, "auth": self.headers.get("Authorization"), **body})
        if mode == "broken":
            self._send(500, b"Internal Server Error: worker crashed")
            return
        if mode == "slow":
            time.sleep(3)
        if mode == "garbage":
            self._send(200, b"<html>not json</html>")
            return
        if mode == "sandbox-error":
            answer = {"status": "SandboxError", "message": "no runner for this language", "run_result": None}
        else:
            answer = fusion_answer(body)
        self._send(200, json.dumps(answer).encode())

    def _send(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_runs_code_and_sends_the_sandboxfusion_request(server):
    box = get_sandbox("http", url=server + "/", headers={"Authorization": "Bearer t0ken"})
    limits = SandboxLimits(wall_s=7, memory_mib=300)
    result = box.run_sync("import sys\nprint(sys.stdin.read().upper())", stdin="hi", limits=limits)
    assert (result.status, result.stdout, result.exit_code) == ("ok", "HI\n", 0)
    sent = Handler.requests[-1]
    assert sent["auth"] == "Bearer t0ken"
    assert {k: sent[k] for k in ("language", "run_timeout", "memory_limit_MB", "stdin", "files")} == {
        "language": "python",
        "run_timeout": 7,
        "memory_limit_MB": 300,
        "stdin": "hi",
        "files": {},
    }


def test_maps_the_services_outcomes(server):
    box = HttpSandbox(url=server, limits=SandboxLimits(wall_s=2, memory_mib=256))
    error = box.run_sync("raise SystemExit(4)")
    assert (error.status, error.exit_code) == ("error", 4)
    timeout = box.run_sync("while True: pass")
    assert timeout.status == "timeout"
    memory = box.run_sync("x = bytearray(10 * 2**30)")
    assert memory.status == "memory" and memory.stderr.rstrip().endswith("MemoryError")
    cut = box.run_sync("print('z' * 5000)", limits=SandboxLimits(max_output_bytes=100))
    assert cut.ok and cut.truncated and cut.stdout == "z" * 100


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("broken", "HTTP 500 Internal Server Error: Internal Server Error: worker crashed"),
        ("slow", "no answer within 1 s"),
        ("garbage", "not JSON"),
        ("sandbox-error", "no runner for this language"),
    ],
)
def test_a_failing_service_is_an_error_result(server, mode, message):
    box = HttpSandbox(url=f"{server}/{mode}", request_timeout_s=1.0)
    result = box.run_sync("print(1)")
    assert result.status == "error" and message in result.message, result.message
    assert f"{server}/{mode}" in result.message


def test_an_unreachable_service_is_an_error_result():
    box = HttpSandbox(url="http://127.0.0.1:9", request_timeout_s=2.0)
    result = box.run_sync("print(1)")
    assert result.status == "error" and "Connection refused" in result.message, result.message


def test_concurrent_calls(server):
    box = HttpSandbox(url=server, max_concurrency=8)

    async def main():
        return await asyncio.gather(*(box.run(f"print({i} * 2)") for i in range(8)))

    assert [r.stdout for r in asyncio.run(main())] == [f"{i * 2}\n" for i in range(8)]


def test_needs_a_url():
    with pytest.raises(ValueError, match="needs url="):
        HttpSandbox()


def test_the_run_sandbox_section_reaches_the_code_reward(server, monkeypatch):
    """export_default (the driver) -> RLCORE_SANDBOX -> default_sandbox (a worker) -> the code reward."""
    from rlcore.rewards.code import compute_score
    from rlcore.sandbox import (
        SANDBOX_ENV,
        SandboxConfig,
        default_sandbox,
        default_sandbox_config,
        export_default,
    )

    monkeypatch.setenv(SANDBOX_ENV, "")  # restored after the test
    assert default_sandbox_config() == SandboxConfig()
    section = SandboxConfig(name="http", limits=SandboxLimits(wall_s=5), options={"url": server + "/tagged"})
    export_default(section)
    assert default_sandbox_config() == section
    assert isinstance(default_sandbox(), HttpSandbox) and default_sandbox().limits.wall_s == 5
    before = len(Handler.requests)
    truth = {"inputs": ["3\n", "4\n"], "outputs": ["9\n", "16\n"]}
    score = compute_score("code", "```python\nn = int(input())\nprint(n * n)\n```", truth)
    assert score["score"] == 1.0
    assert [r["mode"] for r in Handler.requests[before:]] == ["tagged", "tagged"]

    monkeypatch.setenv(SANDBOX_ENV, '{"name": "http", "limits": {"wall": 1}}')
    with pytest.raises(ValueError, match="RLCORE_SANDBOX=.*is not a sandbox section.*unexpected keyword"):
        default_sandbox_config()
