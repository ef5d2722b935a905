"""autotune as an autoconfig service: the tuned settings for the machine a process runs on, a new
machine starting from a similar one, and `autotune serve` / `autotune dashboard` on loopback."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from parallel import build_once

import tuner
from tuner.cli import cli
from tuner.machine.profile import detect_profile
from tuner.measure.records import record_of
from tuner.search.run import WARM_ATTR
from tuner.search.tune import TuneOptions, tune
from tuner.machine.similarity import scale_threads, similarity
from tuner.results.storage import open_storage

REPO = Path(tuner.__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
SPACE = ("version: 1\nparams:\n  quant: {choices: [source, Q8_0]}\n  n_threads: {low: 1, high: auto}\n"
         "  n_threads_batch: {low: 1, high: auto}\n  flash_attn: {choices: [true, false]}\n")
two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to make a second profile")


@pytest.fixture
def tuned(request: pytest.FixtureRequest, tmp_path: Path, sqlite_url: str) -> str:
    """A database with one short real run of this machine (the CPUs the test runs on), default workload shape:
    run once per set of CPUs and copied into the test's folder (tests add to it)."""
    def build(folder: Path) -> None:
        (folder / "space.yaml").write_text(SPACE)
        tune(TuneOptions(budget_s=25, space=str(folder / "space.yaml"), workload="tiny",
                         storage=f"sqlite:///{folder / 'autotune.db'}", repetitions=1, max_quality_loss=None, seed=2))

    cpus = "-".join(map(str, sorted(os.sched_getaffinity(0))))
    built = build_once(request, f"appconfig-tuned-cpus{cpus}", build)
    shutil.copy(built / "space.yaml", tmp_path / "space.yaml")
    shutil.copy(built / "autotune.db", tmp_path / "autotune.db")
    assert sqlite_url == f"sqlite:///{tmp_path / 'autotune.db'}"
    return sqlite_url


def test_similarity_and_thread_scaling() -> None:
    here = detect_profile()
    assert similarity(here, here) >= 0.9
    assert similarity(here, dataclasses.replace(here, arch="riscv64")) == 0.0
    other = dataclasses.replace(here, cpu_model="Intel(R) Xeon(R) Platinum 8488C", cpu_flags=["avx2", "amx_int8"])
    assert similarity(here, other) < similarity(here, here)
    assert scale_threads({"n_threads": 2, "n_threads_batch": 4, "quant": "Q8_0"}, 4, 1) == \
        {"n_threads": 1, "n_threads_batch": 1, "quant": "Q8_0"}


def test_nothing_stored_gives_the_defaults(sqlite_url: str) -> None:
    config = tuner.autoconfig(storage=sqlite_url)
    assert config.source == "defaults" and config.figures == {} and config.profile is None


@pytest.mark.slow
@pytest.mark.engine
def test_measured_settings_load_into_a_llama_that_answers(tuned: str) -> None:
    config = tuner.autoconfig(workload="tiny", storage=tuned)
    assert config.source == "measured" and config.figures["decode_tps"]["median"] > 0
    llm = tuner.load(workload="tiny", storage=tuned)
    s = config.settings
    assert Path(llm.model_path) == Path(config.model_path)
    assert (llm.context_params.n_ctx, llm.context_params.n_batch, llm.context_params.n_ubatch) == \
        (s["n_ctx"], min(s["n_batch"], s["n_ctx"]), min(s["n_ubatch"], s["n_batch"], s["n_ctx"]))
    assert (llm.context_params.n_threads, llm.context_params.n_threads_batch) == (s["n_threads"], s["n_threads_batch"])
    assert (llm.context_params.flash_attn_type == 1) == s["flash_attn"]
    assert bool(llm.model_params.use_extra_bufts) == s["repack"]
    assert llm.create_completion("The harbour", max_tokens=3, temperature=0)["choices"][0]["text"]


@pytest.mark.alone  # needs every CPU, and its runs pinned to one CPU need that CPU quiet (tests/parallel.py)
@pytest.mark.slow
@two_cpus
def test_a_second_profile_gets_a_prediction_then_a_warm_start(tuned: str) -> None:
    before = os.sched_getaffinity(0)
    config = tuner.autoconfig(workload="tiny", storage=tuned, cpus=[0])
    assert os.sched_getaffinity(0) == before  # an application keeps its own CPUs
    assert config.source == "predicted" and config.profile and config.similarity >= 0.5
    assert config.settings["n_threads"] == config.settings["n_threads_batch"] == 1
    cli_out = CliRunner().invoke(cli, ["best", "--predict", "--cpus", "0", "--workload", "tiny", "--storage", tuned,
                                       "--format", "json"])
    assert cli_out.exit_code == 0, cli_out.output
    shown = json.loads(cli_out.output)
    assert (shown["source"], shown["profile"], shown["settings"]["n_threads"]) == ("predicted", config.profile, 1)
    assert os.sched_getaffinity(0) == before
    try:
        result = tune(TuneOptions(budget_s=20, space=str(Path(tuned.removeprefix("sqlite:///")).parent / "space.yaml"),
                                  workload="tiny", storage=tuned, repetitions=1, max_quality_loss=None, cpus=[0]))
    finally:
        os.sched_setaffinity(0, before)
    trials = optuna.load_study(study_name=result.study_name, storage=open_storage(tuned).rdb).get_trials()
    warm = [t for t in trials if t.user_attrs.get(WARM_ATTR)]
    assert warm and record_of(warm[0]).role == "search" and record_of(warm[0]).settings["n_threads"] == 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(args: list[str], ready: str, tmp_path: Path) -> tuple[subprocess.Popen, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", "from tuner.cli import main; main()", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    lines: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        if ready in line:
            return proc, lines
    proc.kill()
    pytest.fail("".join(lines))


@pytest.mark.slow
def test_serve_answers_a_completion_on_loopback_and_stops_on_sigint(tuned: str, tmp_path: Path) -> None:
    port = _free_port()
    proc, lines = _start(["serve", "--port", str(port), "--workload", "tiny", "--storage", tuned,
                          "--engine", "llama-cpp-python"], "serving on", tmp_path)
    assert any(line.startswith("from: measured on this machine") for line in lines), lines
    # Served at the model's trained context (8192 for SmolLM2, which fits), not the tiny workload's, and said so.
    assert any(line.startswith("context: 8192 tokens (the model's trained context)") for line in lines), lines
    assert any(line.startswith("differs from what was measured: n_ctx: measured") and "served 8192" in line
               for line in lines), lines
    body = json.dumps({"prompt": "The lighthouse", "max_tokens": 4, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
    assert answer["choices"][0]["text"] and answer["usage"]["completion_tokens"] >= 1
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0


def test_dashboard_serves_its_page_on_loopback(tmp_path: Path, sqlite_url: str) -> None:
    pytest.importorskip("optuna_dashboard", reason="needs the dashboard extra: pip install 'autotune[dashboard]'")
    storage = open_storage(sqlite_url)
    storage.save_profile(detect_profile())
    optuna.create_study(study_name="dashboard-check-study", storage=storage.rdb)
    port = _free_port()
    proc, _ = _start(["dashboard", "--port", str(port), "--storage", sqlite_url], "dashboard on", tmp_path)
    try:
        url = f"http://127.0.0.1:{port}/dashboard"
        for _ in range(50):
            try:
                page = urllib.request.urlopen(url, timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.2)
        assert "<html" in page.lower()
        if not CHROMIUM.exists():
            pytest.skip("the page is served; rendering it needs Debian's chromium at /usr/bin/chromium")
        # The page is a script-built app: only a real browser shows that it lists the study.
        dom = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                              f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=10000",
                              "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
        assert "dashboard-check-study" in dom, dom[-2000:]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
