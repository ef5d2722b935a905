"""Serving the model with this machine's tuned settings: an OpenAI-compatible server on loopback.

The engine is llama-cpp-python's own server (``llama_cpp.server``, the ``server`` extra), run in
this process (built by :mod:`tuner.backends.llama_cpp.server` with every tuned setting, repacking and
``logits_all`` included), or llama.cpp's ``llama-server`` when one is on PATH (``engine="llama-server"``).
The model answers one short prompt before the server accepts requests, so the first real answer is not
the slow one.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import urllib.error
from typing import Any

from .. import backends
from .appconfig import AutoConfig
from ..errors import AutotuneError
from ..backends.settings import TrialSettings
from ..util.processes import die_with_parent, post_json, wait_until_healthy

HOST = "127.0.0.1"
ENGINES = ("llama-cpp-python", "llama-server")


def pick_engine(engine: str | None) -> str:
    """The engine to serve with: as asked, else llama-server when on PATH, else llama-cpp-python."""
    if engine is None:
        return "llama-server" if shutil.which("llama-server") else "llama-cpp-python"
    if engine not in ENGINES:
        raise AutotuneError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if engine == "llama-server" and not shutil.which("llama-server"):
        raise AutotuneError("llama-server is not on PATH: install llama.cpp, or use --engine llama-cpp-python")
    return engine


def serve(config: AutoConfig, port: int, engine: str, say: Any = print, sock: socket.socket | None = None,
          several_users: bool = False) -> int:
    """Run the server until Ctrl-C (or SIGTERM); the exit status (0 after a clean stop). ``sock``: the
    socket already listening on ``port`` (``autotune serve`` takes it first), else it is opened here.
    ``several_users``: settings tuned by the serve workload, run exactly as measured (llama-server of the
    pinned llama.cpp, built once if it must be, its slots as tuned)."""
    settings = TrialSettings(**config.settings)
    sock = sock or listen(port)  # a busy port is one line before any model loads
    if several_users:
        backend = backends.get(settings.backend)
        binary = backend.serving_engine(say)["binary"]
        engine, command = "llama-server", [binary, *backend.serving_command(settings, config.model_path)[1:]]
    else:
        command = ["llama-server", *backends.get(settings.backend).server_command(settings, config.model_path)]
    if engine == "llama-server":
        sock.close()  # llama-server binds it itself
        cmd = [*command, "--host", HOST, "--port", str(port)]
        proc = subprocess.Popen(cmd, preexec_fn=die_with_parent)
        try:
            if _warm_up_llama_server(proc, port):
                say(f"serving on http://{HOST}:{port}/v1 (OpenAI-compatible, llama-server); Ctrl-C stops")
            return proc.wait()
        except BaseException as exc:  # Ctrl-C, or a server that never became ready: it does not outlive us
            proc.terminate()
            proc.wait()
            if isinstance(exc, KeyboardInterrupt):
                return 0
            raise
    return _serve_llama_cpp_python(settings, config.model_path, sock, say)


LLAMA_SERVER_READY_S = 600  # loading a large model from a cold disk can take minutes


def _warm_up_llama_server(proc: subprocess.Popen, port: int) -> bool:
    """Wait until llama-server's ``/health`` answers 200 (the model is loaded), then have it answer one short
    prompt, as the llama-cpp-python path does; False if the server ended first (its own message says why)."""
    base = f"http://{HOST}:{port}"
    state = wait_until_healthy(proc, base, LLAMA_SERVER_READY_S, poll_s=0.2)
    if state == "ended":
        return False
    if state == "timeout":
        raise AutotuneError(f"llama-server did not become ready within {LLAMA_SERVER_READY_S} s on port {port}")
    try:
        post_json(f"{base}/completion", {"prompt": "Hello", "n_predict": 4, "temperature": 0}, 120)
    except (urllib.error.URLError, OSError) as exc:
        raise AutotuneError(f"llama-server on port {port} did not answer its warm-up prompt ({exc}): "
                            "see its own log above") from None
    return True


def listen(port: int) -> socket.socket:
    """A listening socket on loopback ``port``; AutotuneError (one line) when it cannot be had."""
    try:
        return socket.create_server((HOST, port))
    except OSError as exc:
        raise AutotuneError(f"cannot listen on {HOST}:{port} ({exc.strerror or exc}): another program may use "
                            "that port; choose another with --port") from None


def llama_server_app(settings: TrialSettings, model_path: str, port: int) -> tuple[Any, Any]:
    """llama-cpp-python's server app with every tuned setting, on loopback ``port``, and the ``Llama`` it serves
    (the backend's ``server_app``)."""
    return backends.get(settings.backend).server_app(settings, model_path, HOST, port)


def _serve_llama_cpp_python(settings: TrialSettings, model_path: str, sock: socket.socket, say: Any) -> int:
    port = sock.getsockname()[1]
    try:
        import uvicorn
    except ModuleNotFoundError as exc:
        raise AutotuneError(f"llama-cpp-python's server is not installed ({exc.name}): "
                            "pip install 'autotune[server]'") from None
    app, llm = llama_server_app(settings, model_path, port)
    llm.create_completion("Hello", max_tokens=4, temperature=0)  # warm up before accepting requests
    # Listen before saying so: a client that reads the line may connect at once (the kernel queues
    # its connection until uvicorn accepts it). uvicorn stops cleanly on SIGINT / SIGTERM.
    say(f"serving on http://{HOST}:{port}/v1 (OpenAI-compatible); Ctrl-C stops")
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shuts down, then re-raises the signal it handled
        pass
    say("stopped")
    return 0
