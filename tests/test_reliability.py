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
import pytest
from click.testing import CliRunner

from fault_tally import counted
from tuner.cli import cli
from tuner.util.files import TEMP_MARK, remove_orphan_temps
from tuner.util.processes import exit_text, run_module, signal_name, stderr_line


@counted("serve on a busy port")
def test_serve_on_a_busy_port_is_one_line() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", "--port", str(port)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and lines[-1].startswith("Error: cannot listen on 127.0.0.1:") and "--port" in lines[-1]
    assert not isinstance(result.exception, OSError)


@counted("serve of a transformers pick on a busy port")
def test_serve_of_a_transformers_pick_on_a_busy_port_is_one_line_before_the_model_loads(monkeypatch) -> None:
    # The stored pick is a transformers config (stood in for here: tuning one takes minutes, and only the
    # order of the port check and the model load is under test). The model must never load.
    from tuner.service import appconfig
    from tuner.backends.transformers import loaded as transformers_loaded

    pick = appconfig.AutoConfig(source="measured", profile="p", settings={"backend": "transformers",
                                                                         "dtype": "float32"}, model_path="m.gguf")
    monkeypatch.setattr(appconfig, "autoconfig", lambda *args, **kwargs: pick)

    def load_transformers(*args, **kwargs):
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(transformers_loaded, "load_transformers", load_transformers)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", "--port", str(port)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and lines[-1].startswith("Error: cannot listen on 127.0.0.1:"), result.output
    assert not isinstance(result.exception, (OSError, AssertionError))


@counted("kill -9 during quantization")
@pytest.mark.slow
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


@counted("a database that keeps nothing")
def test_a_database_that_keeps_nothing_is_refused_unless_asked_for(tmp_path: Path) -> None:
    for url in ("sqlite:///", "sqlite:///:memory:"):
        result = CliRunner().invoke(cli, ["run", "--budget", "10s", "--storage", url])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 1 and len(lines) == 1 and "--ephemeral" in lines[0], result.output
    from tuner.search.run import _refuse_ephemeral
    from tuner.search.tune import TuneOptions

    _refuse_ephemeral(TuneOptions(storage="sqlite:///:memory:", ephemeral=True))  # asked for: allowed
    _refuse_ephemeral(TuneOptions(storage=f"sqlite:///{tmp_path / 'a.db'}"))      # a file: allowed


@pytest.mark.slow
@counted("a database that keeps nothing, asked for")
def test_an_ephemeral_database_runs_when_asked_for(tiny_space: Path, hermetic: Path) -> None:
    result = CliRunner().invoke(cli, ["run", "--budget", "15s", "--workload", "tiny", "--space", str(tiny_space),
                                      "--repetitions", "1", "--storage", "sqlite:///", "--ephemeral"])
    assert result.exit_code == 0, result.output
    assert "Recommendation written to" in result.output and "resume" not in result.output, result.output


@counted("the machine lock held by another run")
@pytest.mark.slow
def test_a_run_waiting_for_the_machine_keeps_its_budget(tmp_path: Path) -> None:
    lock = os.environ["AUTOTUNE_MACHINE_LOCK"]  # the test's own lock file (conftest)
    code = (f"import fcntl, time\nfh = open({lock!r}, 'a+')\nfcntl.flock(fh, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\ntime.sleep(300)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        result = CliRunner().invoke(cli, ["run", "--budget", "10s", "--storage", f"sqlite:///{tmp_path / 'a.db'}"])
        took = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
    lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert result.exit_code == 1 and len(lines) == 1 and "another autotune run held the machine" in lines[0], \
        result.output
    assert took <= 40, took  # the budget promise: 10 s + 30 s


@counted("an unusable lock path")
def test_an_unusable_lock_path_is_one_line(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("AUTOTUNE_MACHINE_LOCK", str(blocker / "machine.lock"))
    result = CliRunner().invoke(cli, ["run", "--budget", "10s", "--storage", f"sqlite:///{tmp_path / 'a.db'}"])
    lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert result.exit_code == 1 and len(lines) == 1 and "AUTOTUNE_MACHINE_LOCK" in lines[0], result.output


def test_an_error_is_one_readable_line() -> None:
    from tuner.cli.group import MAX_ERROR_CHARS, one_line

    long = "the model x named in " + repr({"settings": {f"k{i}": i for i in range(500)}}) + "\nis gone"
    line = one_line(long)
    assert "\n" not in line and len(line) <= MAX_ERROR_CHARS + 5 and line.endswith("is gone")
    assert one_line("short\n  text") == "short text"


def test_two_models_whose_names_reduce_alike_keep_two_recommendation_files() -> None:
    from tuner.recommend.document import default_path

    a = default_path("desk", "mödel ñ 模型", "default", "a" * 64)
    b = default_path("desk", "mädel", "default", "b" * 64)
    assert a != b and a.parent == b.parent and a.name.endswith("-aaaaaaaa.yaml") and b.name.endswith("-bbbbbbbb.yaml")


@counted("a full disk during quantization")
@pytest.mark.slow
def test_a_full_disk_during_quantization_is_tried_again_once_space_is_back(tmp_path: Path, monkeypatch) -> None:
    from tuner.backends.llama_cpp.quant import ensure_variant, variant_path
    from tuner.config.model import resolve_model

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    model = resolve_model(None)
    monkeypatch.setenv("AUTOTUNE_FAULT", "quant-enospc")   # the quantizer's write fails with ENOSPC
    full = ensure_variant(model, "Q5_1")
    assert full.error and "no space left on the device holding" in full.error
    assert not variant_path(model, "Q5_1").with_suffix(".json").exists()   # not remembered as final
    monkeypatch.delenv("AUTOTUNE_FAULT")                                  # space is back
    again = ensure_variant(model, "Q5_1")
    assert again.error is None and not again.cache_hit and Path(again.path).is_file()
    assert not list((tmp_path / "cache").rglob(f".*{TEMP_MARK}*"))       # no half-written file left


@counted("a corrupt database file")
def test_a_corrupt_database_says_so_with_sqlites_own_check(tmp_path: Path) -> None:
    from tuner.machine.profile import detect_profile
    from tuner.results.storage import open_storage

    db = tmp_path / "results.db"
    open_storage(f"sqlite:///{db}").save_profile(detect_profile(None, None))   # a real results database
    data = bytearray(db.read_bytes())
    data[4096:] = b"\xff" * (len(data) - 4096)     # every page after the schema page overwritten
    db.write_bytes(bytes(data))
    result = CliRunner().invoke(cli, ["trials", "--storage", f"sqlite:///{db}"])
    lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "damaged" in lines[0] and str(db) in lines[0] and "integrity check" in lines[0], lines[0]


@counted("a full disk under the database")
def test_a_full_disk_is_named_as_such() -> None:
    from tuner.results.db_errors import db_error_message

    line = db_error_message(Exception("(sqlite3.OperationalError) database or disk is full"), "sqlite:////x/a.db")
    assert line.startswith("the disk holding /x is full") and "free some space" in line


@pytest.mark.parametrize("after_s", [0.5, 1.5])
@counted("SIGTERM in the first second")
def test_sigterm_in_the_first_second_ends_with_one_line(after_s: float, tmp_path: Path) -> None:
    # The console script's entry (tuner.entry) answers SIGTERM before the command line is imported: the
    # process ends like Ctrl-C, exit 130 with a line, never a silent 143.
    proc = subprocess.Popen([sys.executable, "-c", "from tuner.entry import main; main()", "run", "--budget", "10s",
                             "--storage", f"sqlite:///{tmp_path / 'a.db'}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(after_s)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "Interrupted" in err and "Traceback" not in err, err
