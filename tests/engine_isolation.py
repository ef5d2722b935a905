"""A pytest plugin: tests marked ``engine`` run in a fresh ``python -m pytest`` process of their own.

Such a test runs llama.cpp inside the test process. A native crash there (a segfault in a
repacked kernel, an abort from a GGML_ASSERT) then fails that one test, with the signal named,
instead of taking the whole suite down. A new process, not a fork: a forked child inherits the
parent's OpenMP state, which can hang llama.cpp's threads.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from _pytest.reports import TestReport

ENGINE_CHILD = "AUTOTUNE_TEST_ENGINE_CHILD"
ENGINE_TEST_TIMEOUT_S = 600


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker (also when the plugin is used outside this project's pytest config)."""
    config.addinivalue_line("markers", "engine: runs llama.cpp in-process; isolated in its own pytest process")


def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Run an ``engine`` test in a child pytest and report what it did as this test's result."""
    if not item.get_closest_marker("engine") or os.environ.get(ENGINE_CHILD):
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    start = time.time()
    try:
        # One test, in one process: no pytest-xdist workers of its own (the suite's own -n is in addopts).
        workers = ["-n", "0"] if item.config.pluginmanager.hasplugin("xdist") else []
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *workers,
                               item.nodeid],
                              capture_output=True, text=True, cwd=item.config.rootpath,
                              env={**os.environ, ENGINE_CHILD: "1"}, timeout=ENGINE_TEST_TIMEOUT_S)
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, output = None, f"still running after {ENGINE_TEST_TIMEOUT_S}s\n{exc.stdout or ''}"
    outcome, longrepr = _child_outcome(item, code, output)
    stop = time.time()
    for when, result in (("setup", "passed" if outcome != "skipped" else "skipped"),
                         ("call", outcome), ("teardown", "passed")):
        if when == "call" and outcome == "skipped":
            continue
        report = TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, result,
                            longrepr if result != "passed" else None, when, duration=stop - start if when == "call"
                            else 0.0, start=start, stop=stop)
        item.ihook.pytest_runtest_logreport(report=report)
    # What pytest's own protocol does after each test: tear the fixtures and collectors (a module set up by
    # an earlier test of this file) down to what the next test shares, else the next module's setup fails
    # with "previous item was not torn down properly".
    item.session._setupstate.teardown_exact(nextitem)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _child_outcome(item: pytest.Item, code: int | None, output: str) -> tuple[str, object]:
    """passed / skipped / failed, and what pytest shows for it, from the child pytest's exit and output."""
    if code is not None and code < 0:
        return "failed", f"the test's process was killed by {signal.Signals(-code).name}:\n{output[-4000:]}"
    if code == 0 and re.search(r"\b1 skipped\b", output) and not re.search(r"\b1 passed\b", output):
        reason = re.search(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", output)
        path, line, _ = item.location
        return "skipped", (str(item.path), (line or 0) + 1, reason.group(1) if reason else "skipped")
    if code == 0:
        return "passed", None
    return "failed", output[-6000:] if code is not None else output
