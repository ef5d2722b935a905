"""What `autotune serve` runs against what was measured (tuner/service/served.py): the served context and
the lines that say what differs. The bundled SmolLM2 was trained on 8192 tokens."""

from __future__ import annotations

import pytest

from tuner import AutotuneError
from tuner.backends.settings import TrialSettings
from tuner.config.model import resolve_model
from tuner.service.served import CTX_STEP, differences, served_context

GIB = 1024**3


def test_the_trained_context_is_served_when_it_fits_and_clipped_when_it_does_not() -> None:
    model = resolve_model(None)
    measured = TrialSettings(n_ctx=1024)
    assert model.context_length == 8192
    assert served_context(model, measured, model.path, 8 * GIB) == (8192, "the model's trained context")
    # Weights (~98 MB) + 64 MiB overhead + KV cache (~23 KB per f16 token): 300 MiB holds some 4000 tokens.
    n_ctx, why = served_context(model, measured, model.path, 300 * 2**20)
    assert measured.n_ctx < n_ctx < 8192 and n_ctx % CTX_STEP == 0 and "clipped" in why
    assert served_context(model, measured.model_copy(update={"type_k": "q8_0", "type_v": "q8_0"}), model.path,
                          300 * 2**20)[0] > n_ctx          # a q8_0 cache holds more tokens in the same memory
    assert served_context(model, measured, model.path, 1)[0] == 1024   # never below what was measured


def test_an_asked_context_is_served_or_refused_in_one_line() -> None:
    model = resolve_model(None)
    assert served_context(model, TrialSettings(n_ctx=1024), model.path, 8 * GIB, asked=2048) == (2048, "--ctx")
    with pytest.raises(AutotuneError, match="more than the 8192 tokens"):
        served_context(model, TrialSettings(n_ctx=1024), model.path, 8 * GIB, asked=16384)
    with pytest.raises(AutotuneError, match="does not fit the memory ceiling"):
        served_context(model, TrialSettings(n_ctx=1024), model.path, 200 * 2**20, asked=8192)


def test_the_differences_name_each_setting_and_the_engine() -> None:
    measured = {"backend": "llama_cpp", "n_ctx": 1024, "n_threads": 2}
    assert differences(measured, dict(measured), "llama-cpp-python") == []
    lines = differences(measured, {**measured, "n_ctx": 8192}, "llama-server")
    assert lines[0] == "n_ctx: measured 1024, served 8192" and "served by llama-server" in lines[1]


FAKE_LLAMA_SERVER = r'''#!{python}
"""Stands in for llama.cpp's llama-server (an external program, not installed here): /health answers 503
twice (the model loading), then 200; /completion records the request. It writes what it saw to $SEEN."""
import http.server, json, os, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
seen = os.environ["SEEN"]
health = {{"calls": 0}}
with open(seen, "a") as fh:
    fh.write("args " + json.dumps(args) + "\n")

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        health["calls"] += 1
        self.send_response(200 if health["calls"] > 2 else 503)
        self.end_headers()
        self.wfile.write(b"{{}}")
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with open(seen, "a") as fh:
            fh.write(f"POST {{self.path}} {{body.decode()}}\n")
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps({{"content": " there"}}).encode())

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def test_llama_server_is_warmed_up_before_serving_on_is_said(tmp_path, monkeypatch) -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "llama-server"
    fake.write_text(FAKE_LLAMA_SERVER.format(python=sys.executable))
    fake.chmod(0o755)
    seen = tmp_path / "seen.txt"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "SEEN": str(seen)}
    proc = subprocess.Popen([sys.executable, "-c", "from tuner.cli import main; main()", "serve", "--port", str(port),
                             "--engine", "llama-server", "--ctx", "2048", "--storage",
                             f"sqlite:///{tmp_path / 'empty.db'}"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "serving on" in line:
                break
        assert any("serving on" in line and "llama-server" in line for line in lines), lines
        log = seen.read_text()   # read when "serving on" was said: the warm-up prompt had been answered
        assert 'POST /completion {"prompt": "Hello"' in log, log
        assert "context: 2048 tokens (--ctx)" in "".join(lines)
        assert '"-c", "2048"' in log   # the served context reached the server's command line
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
