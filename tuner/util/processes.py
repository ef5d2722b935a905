"""Child processes, one way: how autotune starts a ``python -m tuner...`` child, names the signal that
killed one, picks the line of its stderr worth showing, and reads a process's memory from /proc.

Every child dies with its parent (Linux ``PR_SET_PDEATHSIG``), so an autotune killed with SIGKILL
leaves no quantizer, perplexity or engine probe running.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from .paths import PROJECT_ROOT

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (a no-op where prctl is missing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def child_env() -> dict[str, str]:
    """The environment for a ``python -m tuner.…`` child: this package importable from anywhere."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def module_command(module: str, *args: str) -> list[str]:
    """``python -m module args...`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def run_module(module: str, args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``python -m module args`` to its end (:func:`run_command`)."""
    return run_command(module_command(module, *args), timeout_s)


_deadline: ContextVar[float | None] = ContextVar("autotune_child_deadline", default=None)
MIN_CHILD_S = 0.05  # a child started at or past the deadline is given this long (then killed: TimeoutExpired)


@contextlib.contextmanager
def ending_by(deadline: float | None) -> Iterator[None]:
    """Within it, every child :func:`run_command` starts is killed by ``deadline`` (``time.monotonic()``; None:
    no limit but its own timeout): a tuning run's quantizing, perplexity and KL keep the run's budget promise."""
    token = _deadline.set(deadline)
    try:
        yield
    finally:
        _deadline.reset(token)


def run_command(command: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``command`` to its end, output captured, this package importable, dying with this process;
    raises ``subprocess.TimeoutExpired`` (the child killed) past ``timeout_s`` or the deadline of an
    enclosing :func:`ending_by`."""
    deadline = _deadline.get()
    if deadline is not None:
        timeout_s = max(MIN_CHILD_S, min(timeout_s, deadline - time.monotonic()))
    return subprocess.run(list(command), stdin=subprocess.DEVNULL, capture_output=True, env=child_env(),
                          timeout=timeout_s, check=False, preexec_fn=die_with_parent)


def signal_name(returncode: int | None) -> str | None:
    """The name of the signal that ended a child (``SIGSEGV``), None if it exited by itself."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def exit_text(returncode: int | None) -> str:
    """How a child ended, for people: ``SIGSEGV`` or ``exit status 2``."""
    return signal_name(returncode) or f"exit status {returncode}"


def stderr_line(stderr: bytes | str, markers: Sequence[str] = (), limit: int = 200) -> str:
    """The stderr line worth showing: the last one with a marker (``GGML_ASSERT``, ...), else the last
    one saying "error", else the last line; cut to ``limit`` characters."""
    text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for wanted in (lambda ln: any(m in ln for m in markers), lambda ln: "error" in ln.lower(), lambda ln: True):
        picked = next((ln for ln in reversed(lines) if wanted(ln)), None)
        if picked is not None:
            return picked[:limit]
    return ""


def read_status(pid: int | str = "self") -> dict[str, int]:
    """Memory lines of ``/proc/<pid>/status`` in bytes (VmRSS, VmHWM, RssAnon, RssFile, RssShmem);
    empty when the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return {}
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            values[key] = int(rest.split()[0]) * 1024
    return values


def loopback_opener() -> urllib.request.OpenerDirector:
    """An opener for a server on this machine: never through a proxy (an HTTP_PROXY set for the internet must
    not see loopback requests)."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post_json(url: str, body: dict[str, Any], timeout_s: float) -> Any:
    """POST ``body`` as JSON to ``url`` on this machine; the decoded answer (urllib's errors propagate)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with loopback_opener().open(request, timeout=timeout_s) as answer:
        return json.loads(answer.read())


def wait_until_healthy(proc: subprocess.Popen, base_url: str, timeout_s: float, poll_s: float = 0.1) -> str:
    """Poll ``base_url``'s ``/health`` (loopback, never through a proxy) until it answers 200 while ``proc``
    (the server) runs: "ready", "ended" (the server ended first) or "timeout" (``timeout_s`` passed)."""
    opener = loopback_opener()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return "ended"
        try:
            with opener.open(f"{base_url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return "ready"
        except (urllib.error.URLError, OSError):  # not listening yet, or 503 while the model loads
            pass
        time.sleep(poll_s)
    return "timeout"
