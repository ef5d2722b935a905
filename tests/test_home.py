"""One user-level home for results: `autotune run` in one folder, `tuner.autoconfig()` in another
finds what it measured; `--results` keeps a project-local folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import tuner
from tuner.cli import cli
from tuner.util import paths

REPO = Path(tuner.__file__).resolve().parent.parent
SPACE = "version: 1\nparams:\n  n_threads: {low: 1, high: auto}\n  n_ctx: {choices: [512]}\n"


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOTUNE_RESULTS", "AUTOTUNE_STORAGE")}
    return {**env, "AUTOTUNE_HOME": str(home), "PYTHONPATH": str(REPO)}


def test_the_home_and_results_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOTUNE_RESULTS")
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert paths.results_dir() == tmp_path / "home" / "results"
    assert paths.default_storage_url() == f"sqlite:///{tmp_path / 'home' / 'results' / 'autotune.db'}"
    monkeypatch.setenv("AUTOTUNE_RESULTS", "local")  # a project-local folder, made absolute
    assert paths.results_dir() == tmp_path / "local"
    monkeypatch.setenv("AUTOTUNE_STORAGE", "sqlite:////elsewhere.db")  # the library reads it too
    assert paths.default_storage_url() == "sqlite:////elsewhere.db"
    monkeypatch.delenv("AUTOTUNE_HOME")
    monkeypatch.delenv("AUTOTUNE_RESULTS")
    assert "autotune" in paths.home_dir().parts[-1]  # the platform's user data folder
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path / "home"))
    CliRunner().invoke(cli, ["--results", "mine", "profiles"])  # --results: a project-local folder
    assert paths.results_dir() == tmp_path / "mine"


@pytest.mark.slow
def test_a_run_in_one_folder_is_found_from_another(tmp_path: Path) -> None:
    home, here, there = tmp_path / "home", tmp_path / "project", tmp_path / "app"
    here.mkdir()
    there.mkdir()
    (here / "space.yaml").write_text(SPACE)
    run = subprocess.run([sys.executable, "-m", "tuner.cli", "run", "--budget", "20", "--space", "space.yaml",
                          "--workload", "tiny", "--repetitions", "1", "--max-quality-loss", "none"],
                         cwd=here, env=_env(home), capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (home / "results" / "autotune.db").is_file() and not (here / "results").exists()
    found = subprocess.run([sys.executable, "-c", "import tuner; c = tuner.autoconfig(workload='tiny'); "
                            "print(c.source, c.backend)"], cwd=there, env=_env(home),
                           capture_output=True, text=True, timeout=200)
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.split() == ["measured", "llama_cpp"]
