"""The machine-wide trial lock: one trial at a time on a machine, since parallel trials would distort each
other's timings, and the file lock it is made of (also what keeps two processes from making one weights file).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from ..errors import AutotuneError
from ..util.paths import machine_lock_path

LOCK_POLL_S = 0.2  # how often a process waiting its turn for a lock tries again


_held = threading.local()  # how deep this thread is inside machine_lock (the lock is re-entrant)


@contextlib.contextmanager
def machine_lock(on_wait: Callable[[], None] | None = None, deadline: float | None = None) -> Iterator[None]:
    """Hold the machine-wide trial lock; calls ``on_wait`` once if another trial holds it. With a
    ``deadline`` (``time.monotonic()``) a run that is still waiting then gives up with one line
    (:class:`MachineBusy`): the wait counts against its budget like anything else.

    Re-entrant: inside a ``machine_lock`` of the same thread it takes nothing more. A run takes the lock
    before it asks Optuna for a trial (:func:`tuner.search.step.measure`), so a run that never gets the
    machine stores no trial at all, not a failed one; the trial's own lock is then that one."""
    if getattr(_held, "depth", 0):
        _held.depth += 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    path = machine_lock_path()
    try:
        with file_lock(path, on_wait, deadline):
            _held.depth = 1
            try:
                yield
            finally:
                _held.depth = 0
    except LockTimeout:
        raise MachineBusy(f"another autotune run held the machine (lock {path}) until this run's budget was "
                          "spent: run again when it ends, or give a larger --budget") from None


class LockTimeout(Exception):
    """The lock was still held by another process at the deadline."""


class MachineBusy(AutotuneError):
    """Another autotune run held the machine until the deadline: nothing was measured meanwhile."""


@contextlib.contextmanager
def file_lock(path: Path, on_wait: Callable[[], None] | None = None,
              deadline: float | None = None) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if needed); ``on_wait`` is called once if blocked.

    A blocked process waits its turn in ``<path>.queue`` (first come, first served, polling every
    ``LOCK_POLL_S``), so workers on one host take turns. With a
    ``deadline`` a waiter raises :class:`LockTimeout` when it passes. A path that cannot be used is an
    AutotuneError.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+")
    except OSError as exc:
        raise AutotuneError(f"cannot use the lock file {path} ({exc.strerror or exc}): point AUTOTUNE_MACHINE_LOCK "
                            "(or AUTOTUNE_CACHE_DIR) at a folder you can write") from None
    queue = path.with_name(path.name + ".queue")
    with fh:
        _acquire(fh, on_wait, deadline, queue)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _acquire(fh: Any, on_wait: Callable[[], None] | None, deadline: float | None, queue: Path) -> None:
    """Take the flock: at once where nobody waits, else in turn, first come first served (a holder that
    lets go and asks again queues behind those already waiting: two fleet workers on one machine take turns
    instead of one of them measuring everything)."""
    if not _waiters(queue):
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
    if on_wait:
        on_wait()
    me = queue / f"{os.getpid()}-{threading.get_ident()}"
    with contextlib.suppress(OSError):
        queue.mkdir(exist_ok=True)
        me.write_text(repr(time.time()))
    try:
        while True:
            if _first_in_line(queue, me):
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    pass
            if deadline is not None and time.monotonic() >= deadline:
                raise LockTimeout() from None
            time.sleep(LOCK_POLL_S)
    finally:
        with contextlib.suppress(OSError):
            me.unlink()


def _waiters(queue: Path) -> list[tuple[float, str]]:
    """(since when, name) of each live process waiting in ``queue``; a dead waiter's entry is removed."""
    out = []
    with contextlib.suppress(OSError):
        for entry in queue.iterdir():
            try:
                pid, since = int(entry.name.split("-")[0]), float(entry.read_text() or "inf")
            except (OSError, ValueError):
                continue
            if psutil.pid_exists(pid):
                out.append((since, entry.name))
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()
    return out


def _first_in_line(queue: Path, me: Path) -> bool:
    waiting = _waiters(queue)
    return not waiting or min(waiting)[1] == me.name
