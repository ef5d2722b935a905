"""A ``llama-server`` process for one measurement: started with a config on a free loopback port, ready
when its ``/health`` answers, and stopped with the measurement (or with the process that started it, even
one killed with SIGKILL: the kernel ends the server with its parent).

The server's own log goes to a file; when it ends early or never becomes ready, the error says so with the
log's tail, and the trial that started it is recorded as failed with that reason.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from ...measure import disturbance
from ...util.processes import die_with_parent, exit_text, wait_until_healthy
from .kwargs import server_flags
from ..settings_model import TrialSettings


HOST = "127.0.0.1"
READY_TIMEOUT_S = 300.0   # loading (and repacking) a model of a few GB from a cold disk
STOP_TIMEOUT_S = 10.0
LOG_TAIL = 1500
PORT_TRIES = 3            # a port taken between choosing it and the server binding it: try another


class ServerFailed(RuntimeError):
    """llama-server ended or never became ready; the message carries the end of its log."""


def serving_flags(settings: TrialSettings, model_path: str) -> list[str]:
    """The ``llama-server`` flags that reproduce ``settings`` as measured with several users: the slot count
    always given (llama-server's own default is not one slot)."""
    flags = server_flags(settings, model_path)
    if "-np" not in flags:
        flags += ["-np", str(settings.n_parallel)]
    return flags


def free_port() -> int:
    """A loopback port nobody listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """``with LlamaServer(binary, flags, log) as server:`` a ready server at ``server.base_url``."""

    def __init__(self, binary: str, flags: list[str], log_path: Path, ready_timeout_s: float = READY_TIMEOUT_S):
        self.binary, self.flags, self.log_path, self.ready_timeout_s = binary, flags, log_path, ready_timeout_s
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.ready_s = 0.0  # seconds from start to ready (the model's load)

    @property
    def base_url(self) -> str:
        """Where the server answers: ``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the server and wait until it is ready; ServerFailed when it ends first or stays unready."""
        for attempt in range(PORT_TRIES):
            self.port = free_port()
            started = time.monotonic()
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [self.binary, *self.flags, "--host", HOST, "--port", str(self.port)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=die_with_parent)
            disturbance.count_as_own(self.proc.pid)  # the server's CPU time is the trial's own work
            try:
                self._wait_ready()
                self.ready_s = time.monotonic() - started
                return
            except ServerFailed:
                self.stop()
                if attempt + 1 < PORT_TRIES and "bind" in self.log_tail().lower():
                    continue  # another program took the port first: choose again
                raise

    def _wait_ready(self) -> None:
        assert self.proc is not None
        state = wait_until_healthy(self.proc, self.base_url, self.ready_timeout_s)
        if state == "ended":
            raise ServerFailed(f"llama-server ended with {exit_text(self.proc.returncode)} before it was ready: "
                               f"{self.log_tail()}")
        if state == "timeout":
            raise ServerFailed(f"llama-server was not ready within {self.ready_timeout_s:.0f} s: {self.log_tail()}")

    def check_alive(self) -> None:
        """ServerFailed if the server has ended (crashed during a measurement)."""
        if self.proc is not None and (code := self.proc.poll()) is not None:
            raise ServerFailed(f"llama-server ended with {exit_text(code)} while measuring: {self.log_tail()}")

    def stop(self) -> None:
        """End the server: SIGTERM, then SIGKILL if it does not end within ``STOP_TIMEOUT_S``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self) -> str:
        """The end of the server's log, on one line."""
        try:
            text = self.log_path.read_bytes()[-LOG_TAIL:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text.splitlines() if line.strip())[-LOG_TAIL:]

