"""The child process of one trial: load, measure, write a result file (a :class:`tuner.measure.records.TrialResult`), exit.

Run as ``python -m tuner.backends.child SPEC.json RESULT.json``. It dies with its parent (Linux
PR_SET_PDEATHSIG), so an autotune killed with SIGKILL leaves no measurement running.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from .. import backends
from ..measure import disturbance, records as R
from ..measure.spec import TrialSpec
from ..util.files import atomic_write_text
from ..util.processes import die_with_parent, read_status
from .protocol import adapt, allow_wait, cap_timed, on_repetition, watched


def _die_with_parent(parent_pid: int | None) -> None:
    die_with_parent()
    if parent_pid and os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:  # belt and braces where prctl is not available
        while True:
            if parent_pid and os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True).start()


def own_peak_memory() -> dict[str, int]:
    """This process's peak resident memory (VmHWM) and current anonymous / file-backed parts."""
    values = read_status()
    return {"peak_rss": values.get("VmHWM", 0), "peak_anon": values.get("RssAnon", 0),
            "peak_file": values.get("RssFile", 0) + values.get("RssShmem", 0)}


def inject_fault(kind: str) -> None:
    """Misbehave on purpose (fault-injection tests): segfault, abort, hang, oom, raise; stall: hang
    after the first timed repetition (so a trial stopped at the deadline has figures to keep)."""
    if kind == "segfault":
        ctypes.string_at(0)
    elif kind == "abort":
        os.abort()
    elif kind == "hang":
        while True:
            time.sleep(1)
    elif kind == "oom":
        hog = []
        while True:
            hog.append(bytearray(64 * 1024 * 1024))
            time.sleep(0.01)
    elif kind == "raise":
        raise RuntimeError("injected failure")
    elif kind == "stall":
        on_repetition(lambda figures: time.sleep(3600))


def _checked(data: dict[str, Any], memory: dict[str, int]) -> R.TrialResult:
    """``data`` (what the backend measured, or the error) with the child's peak ``memory``, as the result the
    parent reads (:class:`tuner.measure.records.TrialResult`); a backend's figures that do not fit it are this
    trial's error, said as such."""
    try:
        return R.TrialResult.read({**data, "memory": memory})
    except R.ResultError as exc:
        return R.TrialResult(ok=False, error=f"the backend's result does not fit the trial result: {exc}",
                             memory=R.Memory(**memory))


def main(argv: list[str]) -> int:
    """Entry point: measure the spec in ``argv[1]`` and write ``argv[2]``."""
    spec_path, result_path = Path(argv[1]), Path(argv[2])
    spec = TrialSpec.read(spec_path)
    _die_with_parent(spec.parent_pid)
    adapt(spec.adaptive)
    allow_wait(spec.max_wait_s)
    cap_timed(spec.max_timed_s)
    progress_path = spec.progress_path
    if progress_path:  # the parent keeps these figures if it must stop this child
        on_repetition(lambda figures: atomic_write_text(progress_path, json.dumps(figures)))
    if spec.fault:
        inject_fault(spec.fault)
    try:
        data = {**backends.get(spec.backend).measure(spec), "ok": True, disturbance.KEY: watched()}
    except Exception as exc:  # noqa: BLE001 - a Python-level failure is data for the parent
        traceback.print_exc()
        data = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result = _checked(data, own_peak_memory())
    atomic_write_text(result_path, json.dumps(result.public()))
    return 0 if result.ok else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
