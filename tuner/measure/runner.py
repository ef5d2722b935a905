"""Running one config in its own child process, watched from the parent.

The child (the module given by :func:`set_child_entry`: ``python -m tuner.backends.child``) is started in its own session and process group, so
a segfault, an abort, a hang or a memory blow-up inside llama.cpp ends only the child. The
parent polls the child's memory, kills the whole group past the memory ceiling or the
timeout, and turns whatever happened into a :class:`TrialOutcome`. Only one child runs on a
machine at a time (the file lock of :mod:`tuner.measure.lock`), since parallel trials would distort each
other's timings.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from . import records as R
from .spec import TrialSpec
from ..errors import AutotuneError
from ..util.processes import alive, die_with_parent, module_command, read_status, signal_name

POLL_S = 0.05
TREE_EVERY_S = 0.5  # how often the watch looks for the processes a child started (their memory counts)
TRIAL_DIR_PREFIX = "autotune-trial-"  # then the owning autotune's pid: /tmp/autotune-trial-<pid>-xxxx
STDERR_TAIL = 2000


def read_memory(pid: int) -> R.Memory | None:
    """Current resident memory of ``pid`` (total, anonymous, file-backed), or None if gone."""
    values = read_status(pid)
    if "VmRSS" not in values:
        return None
    return R.Memory(peak_rss=values["VmRSS"], peak_anon=values.get("RssAnon", 0),
                    peak_file=values.get("RssFile", 0) + values.get("RssShmem", 0))


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (none once it is gone)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def read_tree_memory(pid: int, children: list[int]) -> R.Memory | None:
    """Resident memory of ``pid`` and of ``children`` (:func:`descendants`: a serve trial's llama-server holds
    the weights and every slot's KV cache), summed; None if ``pid`` is gone."""
    own = read_memory(pid)
    if own is None:
        return None
    total = own
    for child in children:
        more = read_memory(child)
        if more is not None:
            total = R.Memory(peak_rss=total.peak_rss + more.peak_rss, peak_anon=total.peak_anon + more.peak_anon,
                             peak_file=total.peak_file + more.peak_file)
    return total


def _max_memory(a: R.Memory, b: R.Memory | None) -> R.Memory:
    if b is None:
        return a
    return R.Memory(peak_rss=max(a.peak_rss, b.peak_rss), peak_anon=max(a.peak_anon, b.peak_anon),
                    peak_file=max(a.peak_file, b.peak_file))



def remove_orphan_trial_dirs() -> list[Path]:
    """Remove trial folders whose owning process is gone (left by a run killed with SIGKILL)."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{TRIAL_DIR_PREFIX}*"):
        pid = folder.name[len(TRIAL_DIR_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or alive(int(pid)) or not folder.is_dir():
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def _mtime(path: Path) -> int:
    with contextlib.suppress(OSError):
        return path.stat().st_mtime_ns
    return 0


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file the child writes atomically; None while it is absent or unreadable."""
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())
    return None


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-STDERR_TAIL:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


_CHILD_ENTRY: list[str] = []  # the module run as a trial's child, given by the layer that owns it


def set_child_entry(module: str) -> None:
    """Give the runner the module it runs as a trial's child (``python -m MODULE SPEC.json RESULT.json``):
    :mod:`tuner.backends` gives its ``child`` when it loads. The runner names no module above it."""
    _CHILD_ENTRY[:] = [module]


def child_entry() -> str:
    """The module a trial's child runs (:func:`set_child_entry`); AutotuneError while none is given."""
    if not _CHILD_ENTRY:
        raise AutotuneError("no trial child entry point is set: import tuner.backends first")
    return _CHILD_ENTRY[0]


def run_child(spec: TrialSpec | dict[str, Any], *, timeout_s: float, memory_ceiling: int | None,
              tick: Callable[[], None] | None = None, tick_every_s: float = 2.0,
              on_repetition: Callable[[dict[str, Any]], str | None] | None = None,
              entry: str | None = None) -> R.TrialOutcome:
    """Run ``spec`` (a :class:`TrialSpec`, or a dict of its fields) in a child process and report what
    happened; never raises for the child's faults.

    ``tick`` is called every ``tick_every_s`` while the child runs (heartbeats, progress).
    ``on_repetition`` gets the figures so far each time the child finishes a timed repetition;
    when it returns a reason the child is stopped there and the outcome is ``pruned``, with the
    figures of the repetitions it finished.
    A ``KeyboardInterrupt`` or other exception in the parent kills the child's process group
    before it propagates. ``entry``: the child's module (default: the one given by :func:`set_child_entry`).
    """
    with tempfile.TemporaryDirectory(prefix=f"{TRIAL_DIR_PREFIX}{os.getpid()}-") as tmp:
        work = Path(tmp)
        start = time.monotonic()
        proc = _launch(work, spec, entry or child_entry())
        watch = _Watch(proc, work / "progress.json", start, timeout_s, memory_ceiling, tick, tick_every_s,
                       on_repetition)
        try:
            watch.run()
        except BaseException:
            _kill_group(proc)
            raise
        return _outcome(work, proc, watch, time.monotonic() - start)


def _launch(work: Path, spec: TrialSpec | dict[str, Any], entry: str) -> subprocess.Popen:
    """Write the spec into ``work`` and start the trial's child in a session of its own."""
    spec = TrialSpec.coerce(spec).with_runner(os.getpid(), work / "progress.json")
    (work / "spec.json").write_text(spec.model_dump_json())
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1"}
    with open(work / "stderr.txt", "wb") as err:
        return subprocess.Popen(
            module_command(entry, str(work / "spec.json"), str(work / "result.json")),
            stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env, start_new_session=True,
            preexec_fn=die_with_parent)


class _Watch:
    """The parent's watch over a running child: memory, timeout, heartbeats, streamed repetitions."""

    def __init__(self, proc: subprocess.Popen, progress_path: Path, start: float, timeout_s: float,
                 memory_ceiling: int | None, tick: Callable[[], None] | None, tick_every_s: float,
                 on_repetition: Callable[[dict[str, Any]], str | None] | None) -> None:
        self.proc, self.progress_path, self.start, self.timeout_s = proc, progress_path, start, timeout_s
        self.memory_ceiling, self.tick, self.tick_every_s, self.on_repetition = memory_ceiling, tick, tick_every_s, \
            on_repetition
        self.peak, self.status, self.reason = R.Memory(), None, ""
        self.last_tick, self.seen, self.stamp = start, 0, 0
        self.tree: list[int] = []
        self.tree_at = 0.0

    def run(self) -> None:
        """Poll until the child ends or is stopped (``status`` then says why)."""
        while self.proc.poll() is None and self.status is None:
            now = time.monotonic()
            if now - self.tree_at >= TREE_EVERY_S:  # a scan of every process: not at every poll
                self.tree, self.tree_at = descendants(self.proc.pid), now
            self.peak = _max_memory(self.peak, read_tree_memory(self.proc.pid, self.tree))
            if self.memory_ceiling and self.peak.peak_rss > self.memory_ceiling:
                self._stop(R.OVER_CEILING, f"resident memory {self.peak.peak_rss} bytes crossed the ceiling "
                                           f"{self.memory_ceiling}")
            elif now - self.start > self.timeout_s:
                self._stop(R.TIMEOUT, f"still running after the {self.timeout_s:.0f}s trial timeout")
            else:
                if self.tick and now - self.last_tick >= self.tick_every_s:
                    self.tick()
                    self.last_tick = now
                self._repetitions()
                if self.status is None:
                    time.sleep(POLL_S)

    def _repetitions(self) -> None:
        """Hand each newly finished repetition's figures to ``on_repetition``; stop when it says so."""
        if not self.on_repetition or (changed := _mtime(self.progress_path)) == self.stamp:
            return
        self.stamp = changed
        figures = _read_json(self.progress_path)
        done = len((figures or {}).get("request_s") or [])
        if done > self.seen:
            self.seen = done
            stop = self.on_repetition(figures)  # type: ignore[arg-type]
            if stop:
                self._stop(R.PRUNED, stop)

    def _stop(self, status: str, reason: str) -> None:
        _kill_group(self.proc)
        self.status, self.reason = status, reason


def _outcome(work: Path, proc: subprocess.Popen, watch: _Watch, wall: float) -> R.TrialOutcome:
    """What happened to the child, from its exit, its result file (a :class:`TrialResult`) and what the watch saw.
    A result this autotune cannot read (malformed, or of a newer version) is the trial's error, not a crash here."""
    code = proc.returncode
    result, unreadable = _read_result(work / "result.json")
    peak = watch.peak
    if result is not None and result.memory is not None:
        peak = _max_memory(peak, result.memory)
    sig = signal_name(code)
    status, reason = watch.status, watch.reason
    if status is None:
        if code == 0 and result is not None and result.ok:
            status = R.OK
        elif sig:
            status, reason = R.CRASHED, f"child killed by {sig}"
        elif unreadable:
            status, reason = R.ERROR, f"the child's result cannot be read: {unreadable}"[:500]
        elif result is not None and result.error:
            status, reason = R.ERROR, result.error[:500]
        else:
            status, reason = R.CRASHED, f"child exited with status {code} and no result"
    kept = result if status == R.OK else None
    if status in (R.TIMEOUT, R.PRUNED):  # the repetitions the child finished before it was stopped
        kept, _ = _read_result(work / "progress.json")
    return R.TrialOutcome(status=status, reason=reason, exit_code=code if code and code > 0 else (0 if code == 0 else None),
                          signal=sig, stderr_tail=_tail(work / "stderr.txt"), wall_s=round(wall, 3),
                          memory=peak, result=kept.public() if kept is not None else None)


def _read_result(path: Path) -> tuple[R.TrialResult | None, str]:
    """The child's result (or its streamed figures so far) at ``path``: (the result, "") or, where there is
    a file this autotune cannot read as one, (None, why); (None, "") where there is none."""
    data = _read_json(path)
    if data is None:
        return None, ""
    try:
        return R.TrialResult.read(data), ""
    except R.ResultError as exc:
        return None, str(exc)
