"""A pytest plugin: the suite on several pytest-xdist workers, without tests disturbing what others measure.

The README's test command runs the suite on one worker per CPU (``-n auto`` in pyproject.toml). Most
tests only wait: on a budget, a subprocess, a server. Those run side by side. A test whose assertions
rest on measured speed (a config faster than another, enough trials in a short budget on a quiet
machine, a figure close to another) is marked ``alone``: while it runs, no other test runs on any
worker. The lock is an ordinary readers-writer lock on files shared by the workers: every test takes
it shared, an ``alone`` test exclusive; a turnstile in front of it keeps a waiting ``alone`` test from
being overtaken by the next shared test again and again; consecutive ``alone`` tests of one worker (keep
them together with ``xdist_group``) hold it through. Shared tests run pinned to their worker's own
CPU (:func:`worker_cpus`); an ``alone`` test gets every CPU, and so does a test marked ``all_cpus``: one
that needs the machine's CPU count (a second profile, a space of two threads) but asserts nothing a
neighbour's load could change, so it runs beside the others.

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
from typing import Any

import pytest

ALONE = "alone"
ALL_CPUS = "all_cpus"
ENGINE_CHILD = "AUTOTUNE_TEST_ENGINE_CHILD"  # a test's own pytest process (engine_isolation.py): its parent holds the lock


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker."""
    config.addinivalue_line("markers", f"{ALONE}: measures speed; no other test runs on any worker meanwhile")
    config.addinivalue_line("markers", f"{ALL_CPUS}: needs every CPU (a second profile, a 2-thread space) but "
                                       "measures nothing that a neighbour disturbs: runs beside other tests")


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


class _Held:
    """The machine lock as this worker holds it between tests (an exclusive hold is kept over consecutive
    ``alone`` tests, so a run of them waits for the other workers once, not once per test)."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.exclusive = False

    def take(self, folder: Path, exclusive: bool) -> None:
        """Hold the lock, exclusively or shared, through the turnstile."""
        if self.handle is not None and self.exclusive == exclusive:
            return
        self.drop()
        with _flock(folder / "autotune-turnstile.lock", fcntl.LOCK_EX):
            handle = (folder / "autotune-machine.lock").open("a")
            fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        self.handle, self.exclusive = handle, exclusive

    def drop(self) -> None:
        """Let go of the lock, if held."""
        if self.handle is not None:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


_HELD = _Held()


def _locking(config: pytest.Config) -> bool:
    return not os.environ.get(ENGINE_CHILD) and hasattr(config, "workerinput")


def worker_cpus(config: pytest.Config) -> set[int] | None:
    """The CPU a worker's shared tests run on: worker *i* of *n* gets CPU *i* (mod the CPUs this session may
    use), so two workers' llama.cpp threads never wait on each other (two 2-thread engines on 2 CPUs run
    up to 7x slower than one). None where nothing is pinned: no xdist, one worker, or one CPU."""
    if os.environ.get(ENGINE_CHILD) or not hasattr(config, "workerinput") or not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(config.stash.setdefault(_ALL_CPUS, frozenset(os.sched_getaffinity(0))))
    workers = int(config.workerinput.get("workercount", 1))
    if workers < 2 or len(allowed) < 2:
        return None
    index = int(str(config.workerinput["workerid"]).removeprefix("gw"))
    return {allowed[index % len(allowed)]}


_ALL_CPUS = pytest.StashKey[frozenset]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Run each test (its fixtures' setup and teardown included) under the machine lock: an ``alone`` test
    on every CPU, the others on their worker's own CPU (children inherit it, and the disturbance watch
    then looks at that CPU only)."""
    alone = item.get_closest_marker(ALONE) is not None
    every_cpu = alone or item.get_closest_marker(ALL_CPUS) is not None
    pinned = worker_cpus(item.config)
    if _locking(item.config):
        _HELD.take(shared_dir(item.config), alone)
    if pinned is not None:
        os.sched_setaffinity(0, set(item.config.stash[_ALL_CPUS]) if every_cpu else pinned)
    try:
        yield
    finally:
        if pinned is not None:
            os.sched_setaffinity(0, set(item.config.stash[_ALL_CPUS]))
        if not (alone and nextitem is not None and nextitem.get_closest_marker(ALONE) is not None):
            _HELD.drop()


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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every ``alone`` test joins one xdist group: they run one after another on one worker, which holds the
    machine through the whole chain instead of waiting for the other workers before each of them."""
    for item in items:
        if item.get_closest_marker(ALONE) is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(ALONE))
