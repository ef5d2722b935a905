"""The suite's own guard: a test that crashes llama.cpp in-process fails alone (tests/engine_isolation.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CRASHING = '''
import ctypes
import pytest

@pytest.mark.engine
def test_native_crash():
    ctypes.string_at(0)  # what a segfault in a repacked kernel does to the process

@pytest.mark.engine
def test_fine():
    assert True

@pytest.mark.engine
def test_skipped():
    pytest.skip("nothing to do here")

def test_after_the_crash():
    assert True
'''


def test_a_native_crash_fails_one_test_and_the_session_goes_on(tmp_path: Path) -> None:
    (tmp_path / "test_crashing.py").write_text(textwrap.dedent(CRASHING))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop("AUTOTUNE_TEST_ENGINE_CHILD", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "engine_isolation", "-p",
                           "no:cacheprovider", "test_crashing.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 2 passed, 1 skipped" in out, out
    assert "killed by SIGSEGV" in out and "nothing to do here" in out
