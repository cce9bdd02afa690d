"""The ``http`` sandbox: a SandboxFusion-style service runs the code (``POST {url}/run_code``).

Request (SandboxFusion's ``RunCodeRequest``)::

    {"code": "...", "language": "python", "compile_timeout": s, "run_timeout": s,
     "memory_limit_MB": n, "stdin": "...", "files": {}, "fetch_files": []}

Response (``RunCodeResponse``)::

    {"status": "Success" | "Failed" | "SandboxError", "message": "...", "compile_result": {...} | null,
     "run_result": {"status": "Finished" | "Error" | "TimeLimitExceeded", "execution_time": s,
                    "return_code": n, "stdout": "...", "stderr": "..."} | null, "files": {}}

A service that is down, slow past ``request_timeout_s``, answers an HTTP error or something that is not
this schema gives a result with status ``error`` and a ``message`` naming the URL, never an exception.
Standard library only (``urllib`` on a worker thread), so the trainer needs no HTTP client package.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import weakref
from typing import Any

from rlcore.sandbox.api import Sandbox, SandboxLimits, SandboxResult


class HttpSandbox(Sandbox):
    """Runs each call on the service at ``url`` (``http://host:port``, the part before ``/run_code``).

    ``request_timeout_s`` bounds one HTTP exchange (default: ``limits.wall_s`` plus 30 s for queueing
    and start-up on the service); ``max_concurrency`` bounds requests in flight per event loop;
    ``headers`` are added to each request (an API token, say).
    """

    name = "http"

    def __init__(
        self,
        *,
        url: str | None = None,
        limits: SandboxLimits | None = None,
        request_timeout_s: float | None = None,
        max_concurrency: int = 32,
        headers: dict[str, str] | None = None,
        language: str = "python",
    ):
        super().__init__(limits=limits)
        if not url:
            raise ValueError(
                "the http sandbox needs url= (sandbox.options.url), the address of a SandboxFusion-style "
                "service, e.g. http://localhost:8080"
            )
        self.url = url.rstrip("/")
        self.request_timeout_s = request_timeout_s
        self.max_concurrency = max_concurrency
        self.headers = dict(headers or {})
        self.language = language
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"HttpSandbox(url={self.url!r}, limits={self.limits})"

    async def run(self, code: str, *, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
        limits = limits or self.limits
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency)
        request = {
            "code": code,
            "language": self.language,
            "compile_timeout": limits.wall_s,
            "run_timeout": limits.wall_s,
            "memory_limit_MB": limits.memory_mib,
            "stdin": stdin,
            "files": {},
            "fetch_files": [],
        }
        timeout = self.request_timeout_s or limits.wall_s + 30.0
        start = time.monotonic()
        async with semaphore:
            try:
                answer = await asyncio.to_thread(self._post, request, timeout)
            except Exception as exc:
                return SandboxResult(
                    status="error",
                    message=f"sandbox service {self.url}/run_code failed: {_describe(exc, timeout)}",
                    wall_s=time.monotonic() - start,
                )
        return _result(answer, limits, time.monotonic() - start, self.url)

    def _post(self, request: dict[str, Any], timeout: float) -> Any:
        req = urllib.request.Request(
            f"{self.url}/run_code",
            data=json.dumps(request).encode(),
            headers={"Content-Type": "application/json", **self.headers},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return json.loads(response.read().decode("utf-8", "replace"))


def _describe(exc: Exception, timeout: float) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        body = exc.read().decode("utf-8", "replace")[:300] if exc.fp else ""
        return f"HTTP {exc.code} {exc.reason}" + (f": {body}" if body else "")
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError):
        return f"no answer within {timeout:g} s (request_timeout_s)"
    if isinstance(exc, json.JSONDecodeError):
        return f"the answer is not JSON ({exc})"
    return f"{type(reason).__name__}: {reason}"


def _cut(text: Any, cap: int) -> tuple[str, bool]:
    text = text if isinstance(text, str) else ""
    data = text.encode("utf-8", "replace")
    if len(data) <= cap:
        return text, False
    return data[:cap].decode("utf-8", "ignore"), True


def _result(answer: Any, limits: SandboxLimits, wall_s: float, url: str) -> SandboxResult:
    if not isinstance(answer, dict):
        return SandboxResult(
            status="error", message=f"sandbox service {url} answered {type(answer).__name__}, not an object"
        )
    run = answer.get("run_result")
    compiled = answer.get("compile_result") or {}
    if not isinstance(run, dict):
        # Never ran: a compile error, or the service's own failure (SandboxError).
        message = answer.get("message") or compiled.get("stderr") or f"status {answer.get('status')!r}"
        return SandboxResult(
            status="error",
            stderr=str(compiled.get("stderr") or ""),
            message=f"sandbox service {url}: {message}",
            wall_s=wall_s,
        )
    stdout, cut_out = _cut(run.get("stdout"), limits.max_output_bytes)
    stderr, cut_err = _cut(run.get("stderr"), limits.max_output_bytes)
    code = run.get("return_code")
    common = {
        "stdout": stdout,
        "stderr": stderr,
        "exit_code": code if isinstance(code, int) else None,
        "wall_s": wall_s,
        "cpu_s": None,
        "truncated": cut_out or cut_err,
        "isolation": {"remote": url},
    }
    run_status = run.get("status")
    if run_status == "TimeLimitExceeded":
        return SandboxResult(
            status="timeout", message=f"the service's time limit ({limits.wall_s:g} s)", **common
        )
    if run_status == "Finished" and code == 0:
        return SandboxResult(status="ok", **common)
    if stderr.rstrip().rsplit("\n", 1)[-1].startswith("MemoryError"):
        return SandboxResult(status="memory", message=f"out of memory ({limits.memory_mib} MiB)", **common)
    if isinstance(code, int) and code < 0:
        return SandboxResult(status="killed", message=f"ended by signal {-code}", **common)
    return SandboxResult(status="error", message=f"run status {run_status!r}, exit code {code}", **common)
