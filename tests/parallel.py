"""A pytest plugin: the suite on several pytest-xdist workers, without tests disturbing what others measure.

The README's test command runs the suite on one worker per CPU (``-n auto`` in pyproject.toml). Most
tests only wait: on a budget, a subprocess, a server. Those run side by side. A test whose assertions
rest on measured speed (a config faster than another, enough trials in a short budget on a quiet
machine, a figure close to another) is marked ``alone``: while it runs, no other test runs on any
worker. The lock is an ordinary readers-writer lock on files shared by the workers: every test takes
it shared, an ``alone`` test exclusive; a turnstile in front of it keeps a waiting ``alone`` test from
being overtaken by the next shared test again and again.

:func:`build_once` makes a costly thing (a real tuning run several tests only read) once per test
session, whichever worker asks first; the others wait for it and read the same files.

Without xdist (``-p no:xdist`` or ``-n 0``) the locks have nobody to wait for and cost nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ALONE = "alone"
ENGINE_CHILD = "AUTOTUNE_TEST_ENGINE_CHILD"  # a test's own pytest process (engine_isolation.py): its parent holds the lock


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker."""
    config.addinivalue_line("markers", f"{ALONE}: measures speed; no other test runs on any worker meanwhile")


def shared_dir(config: pytest.Config) -> Path:
    """A folder every worker of this test session sees (the parent of the workers' own temp folders)."""
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return base.parent if hasattr(config, "workerinput") else base


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def machine_share(config: pytest.Config, alone: bool) -> Iterator[None]:
    """Hold the machine exclusively (``alone``) or shared with other non-alone tests, for the block."""
    if os.environ.get(ENGINE_CHILD) or not hasattr(config, "workerinput"):
        yield
        return
    folder = shared_dir(config)
    turnstile, machine = folder / "autotune-turnstile.lock", folder / "autotune-machine.lock"
    with _flock(turnstile, fcntl.LOCK_EX):
        held = _flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        held.__enter__()
    try:
        yield
    finally:
        held.__exit__(None, None, None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Run each test (its fixtures' setup and teardown included) under the machine lock."""
    with machine_share(item.config, item.get_closest_marker(ALONE) is not None):
        yield


def build_once(request: pytest.FixtureRequest, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name``, shared by every worker, filled by ``build(folder)`` the first time any asks.

    A build that raised is not kept: the next test to ask builds again (and fails the same way, visibly).
    """
    folder = shared_dir(request.config) / f"built-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    with _flock(folder.with_suffix(".lock"), fcntl.LOCK_EX):
        done = folder / ".built"
        if not done.exists():
            build(folder)
            done.touch()
    return folder
