"""Nothing left behind, no traceback for an environment problem: every child autotune starts dies with
its parent and its half-written files are removed by the next run; a busy port is one line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
from click.testing import CliRunner

from tuner.cli import cli
from tuner.util.files import TEMP_MARK, remove_orphan_temps
from tuner.util.processes import exit_text, run_module, signal_name, stderr_line


def test_serve_on_a_busy_port_is_one_line() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", "--port", str(port)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and lines[-1].startswith("Error: cannot listen on 127.0.0.1:") and "--port" in lines[-1]
    assert not isinstance(result.exception, OSError)


def test_a_quantizer_dies_with_its_parent_and_the_next_run_removes_its_file(tmp_path: Path) -> None:
    # A parent that quantizes the bundled model, killed with SIGKILL while its quantizer child runs.
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path / "cache")}
    code = ("from tuner.config.model import resolve_model\n"
            "from tuner.backends.llama_cpp.quant import ensure_variant\n"
            "ensure_variant(resolve_model(None), 'F16', nthread=1)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], env=env)
    child = None
    deadline = time.monotonic() + 120
    while child is None and time.monotonic() < deadline and parent.poll() is None:
        child = next((p for p in psutil.Process(parent.pid).children() if "llama_cpp.quant" in " ".join(p.cmdline())),
                     None)
        time.sleep(0.01)
    assert child is not None, "the quantizer child was not seen"
    time.sleep(0.3)  # let it start writing
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    gone, _ = psutil.wait_procs([child], timeout=10)
    assert gone, "the quantizer outlived its parent"
    # Whatever it had written is removed by the next run's clean-up (its writer is gone).
    leftovers = list((tmp_path / "cache").rglob(f".*{TEMP_MARK}*"))
    remove_orphan_temps(tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob(f".*{TEMP_MARK}*"))
    assert all(not p.exists() for p in leftovers)


def test_one_launcher_one_signal_naming_one_stderr_picker() -> None:
    proc = run_module("tuner.util.processes", (), timeout_s=60)  # importable as a module: exits 0
    assert proc.returncode == 0 and signal_name(0) is None
    assert signal_name(-11) == "SIGSEGV" and exit_text(-6) == "SIGABRT" and exit_text(2) == "exit status 2"
    err = b"loading\nllama.cpp:123: GGML_ASSERT(x) failed\nbye\n"
    assert stderr_line(err, ("GGML_ASSERT",)) == "llama.cpp:123: GGML_ASSERT(x) failed"
    assert stderr_line(b"a\nan Error here\nb\n") == "an Error here" and stderr_line(b"") == ""
