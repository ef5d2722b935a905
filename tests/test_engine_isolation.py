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


MODULE_FIXTURE_THEN_ENGINE = '''
import pytest

@pytest.fixture(scope="module")
def shared():
    return 1

def test_in_process(shared):
    assert shared == 1

@pytest.mark.engine
def test_isolated_last_in_its_module():
    assert True
'''


def test_an_isolated_test_last_in_its_module_leaves_the_next_module_a_clean_setup(tmp_path: Path) -> None:
    # CI failed this way: a module set up by an in-process test stayed on pytest's setup stack when the
    # module's last test ran isolated, and the next module's first test errored at setup.
    (tmp_path / "test_a.py").write_text(textwrap.dedent(MODULE_FIXTURE_THEN_ENGINE))
    (tmp_path / "test_b.py").write_text("def test_next_module():\n    assert True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop("AUTOTUNE_TEST_ENGINE_CHILD", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "engine_isolation", "-p", "no:cacheprovider",
                           "test_a.py", "test_b.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "3 passed" in out and "error" not in out.lower(), out
