"""Shared fixtures. Every test runs against a temporary results folder, cache and machine lock
(via the AUTOTUNE_* environment variables), so no test touches a user's data."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tuner.config.model import bundled_model_path

# A shell starts a background job (`pytest ... &`, nohup, some CI runners) with SIGINT ignored, and
# an ignored signal stays ignored in every process it starts: the `autotune run` and `serve` processes
# the tests interrupt would never see their SIGINT (a Ctrl-C). The tests start them with the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# engine_isolation: tests marked `engine` run in a pytest process of their own; parallel: tests marked `alone`
# have the machine to themselves on parallel workers; fault_tally: the fault-injection figures at the end.
pytest_plugins = ["engine_isolation", "parallel", "fault_tally"]

TINY_SPACE = """\
version: 1
description: a small llama.cpp space for tests
params:
  n_threads: {low: 1, high: auto}
  n_threads_batch: {low: 1, high: auto}
  n_batch: {choices: [64, 128, 512]}
  n_ubatch: {choices: [64, 128]}
  n_ctx: {choices: [256, 512]}
  flash_attn: {choices: [true, false]}
"""


@pytest.fixture(scope="session")
def shared_cache(request: pytest.FixtureRequest) -> Path:
    """One derived-file cache for the whole session, shared by every xdist worker (quantized variants and
    their quality figures are costly; the cache's own locks make concurrent makers wait for one another)."""
    from parallel import shared_dir

    folder = shared_dir(request.config) / "cache"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(autouse=True)
def hermetic(tmp_path: Path, shared_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point results, cache and the machine lock at temporary places."""
    results = tmp_path / "results"
    monkeypatch.setenv("AUTOTUNE_RESULTS", str(results))
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path / "home"))  # never the user's real data folder
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(shared_cache))
    monkeypatch.setenv("AUTOTUNE_MACHINE_LOCK", str(tmp_path / "machine.lock"))
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    monkeypatch.delenv("AUTOTUNE_FAULT", raising=False)
    return results


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The bundled SmolLM2-135M-Instruct Q4_1 GGUF."""
    return bundled_model_path()


@pytest.fixture
def tiny_space(tmp_path: Path) -> Path:
    """A small llama.cpp-only search space file."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_SPACE)
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite database URL in the test's temp folder."""
    return f"sqlite:///{tmp_path / 'autotune.db'}"


@pytest.fixture(scope="session")
def repack_ok(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> bool:
    """Whether weight repacking runs for the bundled model here (probed once, in a child process).

    In-process engine tests build their ``Llama`` with this, as autotune itself would on this machine.
    """
    from tuner.backends.llama_cpp.health import probe_repack

    return probe_repack(str(model_path), "Q4_1").usable


def cpu_count() -> int:
    """CPUs this process may use."""
    return len(os.sched_getaffinity(0))


MAX_WORKERS = 4  # more parallel tuning runs than this gain little and hold several GB each


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one pytest-xdist worker per CPU this process may use, at most :data:`MAX_WORKERS`."""
    return max(1, min(cpu_count(), MAX_WORKERS))
