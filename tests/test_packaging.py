"""autotune as users install a command-line tool: a built wheel, installed apart from this checkout,
run from an empty folder (the shipped search spaces and workloads must travel inside the wheel)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from parallel import build_once

# the module fixture is built once, on one worker
pytestmark = pytest.mark.xdist_group("packaging")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(request: pytest.FixtureRequest) -> Path:
    """The wheel, built once for every worker (two builds at once in this checkout's build/ folder collide)."""
    def build(out: Path) -> None:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(ROOT)], check=True, capture_output=True, timeout=300)

    (built,) = build_once(request, "wheel", build).glob("autotune-*.whl")
    return built


def test_the_wheel_carries_the_spaces_workloads_and_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("tuner/search_spaces/cpu.yaml", "tuner/search_spaces/llama-cpp.yaml",
                 "tuner/search_spaces/workloads.yaml", "tuner/data/eval.txt", "tuner/data/corpus.txt",
                 "tuner/cli/__init__.py", "tuner/backends/llama_cpp/backend.py"):
        assert name in names, f"{name} is not in {wheel.name}"


@pytest.mark.slow
def test_the_installed_wheel_tunes_from_an_empty_folder(wheel: Path, tmp_path: Path) -> None:
    target, empty = tmp_path / "site", tmp_path / "empty"
    empty.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target)}  # ahead of the editable checkout
    code = ("import sys, tuner; from tuner.cli import main; "
            "assert tuner.__file__.startswith(sys.argv.pop(1)), tuner.__file__; main()")
    proc = subprocess.run([sys.executable, "-c", code, str(target), "run", "--budget", "25s", "--workload", "tiny",
                           "--space", "llama-cpp", "--repetitions", "1"], cwd=empty, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Recommendation written to" in proc.stdout
    assert list(Path(os.environ["AUTOTUNE_RESULTS"]).glob("*/*.tiny.yaml"))
