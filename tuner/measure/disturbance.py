"""How disturbed each timed repetition was, and what a run does about it.

A repetition measured while another process ran on the machine (a build, a browser, another
benchmark, or the hypervisor giving the CPU to another VM: steal time) is slower for a reason that has
nothing to do with the config. The trial's child watches every repetition: the CPU time the whole
machine spent busy (``/proc/stat`` through psutil, steal included) minus the time its own threads
used, and the load average. A repetition in which other processes took more than
``DISTURBED_SHARE`` of one CPU on average is *disturbed*: the child runs one more repetition in its
place (at most ``MAX_REPEATS`` per trial) and leaves the disturbed one out of its figures, so a trial
still reports the repetitions it was asked for. The run summary and the recommendation say how many
repetitions were disturbed and whether the pick rests on disturbed figures.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil

DISTURBED_SHARE = 0.25   # other processes took a quarter of one CPU on average during the repetition
MAX_REPEATS = 2          # disturbed repetitions a trial replaces by new ones
KEY = "disturbance"      # the per-repetition list in a child's result, and the record's extra section
KEPT_AT = "kept_at"      # in a record's section: positions of the disturbed repetitions its figures kept


def _machine_busy_s() -> tuple[float, float]:
    """(CPU seconds the machine spent busy, of which stolen by the hypervisor) since boot."""
    t = psutil.cpu_times()
    steal = getattr(t, "steal", 0.0)
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + steal
    return busy, steal


def _own_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


class Watch:
    """Watches one repetition of this process: :meth:`start` before it, :meth:`stop` after."""

    def __init__(self) -> None:
        self._start: tuple[float, float, float, float] | None = None

    def start(self) -> None:
        """Note the machine's and this process's CPU time now."""
        busy, steal = _machine_busy_s()
        self._start = (time.monotonic(), busy, steal, _own_s())

    def stop(self) -> dict[str, Any] | None:
        """What other processes took since :meth:`start` (None if it was not started)."""
        if self._start is None:
            return None
        t0, busy0, steal0, own0 = self._start
        self._start = None
        wall = max(time.monotonic() - t0, 1e-6)
        busy, steal = _machine_busy_s()
        other = max((busy - busy0) - (_own_s() - own0), 0.0)
        return {"wall_s": round(wall, 3), "other_cpu_s": round(other, 3), "steal_s": round(steal - steal0, 3),
                "load1": round(os.getloadavg()[0], 2), "disturbed": other / wall > DISTURBED_SHARE}


def should_replace(before: list[dict[str, Any]], latest: dict[str, Any]) -> bool:
    """Whether the repetition just watched (``latest``) was disturbed and one more may run in its place
    (``before``: the repetitions watched before it; at most ``MAX_REPEATS`` are replaced per trial)."""
    return bool(latest.get("disturbed")) and sum(1 for d in before if d.get("replaced")) < MAX_REPEATS


def summary(per_repetition: list[dict[str, Any]]) -> dict[str, Any]:
    """A trial's disturbance, for its record: repetitions timed (replaced ones included), disturbed,
    replaced by a new one, and the share of a CPU other processes took on average."""
    wall = sum(d["wall_s"] for d in per_repetition)
    disturbed = sum(1 for d in per_repetition if d.get("disturbed"))
    replaced = sum(1 for d in per_repetition if d.get("replaced"))
    kept = [i for i, d in enumerate(d for d in per_repetition if not d.get("replaced")) if d.get("disturbed")]
    return {"repetitions": len(per_repetition), "disturbed": disturbed, "replaced": replaced,
            "other_cpu_share": round(sum(d["other_cpu_s"] for d in per_repetition) / wall, 3) if wall else 0.0,
            **({KEPT_AT: kept} if kept else {})}


def kept_at(record: Any) -> set[int]:
    """Positions, in a trial record's per-repetition figures, of the disturbed repetitions it kept (no
    replacement was left); none known for records written before the positions were stored."""
    return set((record.extra.get(KEY) or {}).get(KEPT_AT, ()))


def undisturbed(records: list[Any], figure: str) -> list[float]:
    """The samples of ``figure`` (a record field: "prefill", "decode", "request", ...) that ``records`` took
    on an undisturbed machine, or all of them when every one was disturbed: a config's figures rest on
    its quiet repetitions wherever it has any, so a busy neighbour can neither sink nor crown it."""
    quiet, every = [], []
    for record in records:
        stat, disturbed = getattr(record, figure), kept_at(record)
        if stat:
            every += stat.samples
            quiet += [s for i, s in enumerate(stat.samples) if i not in disturbed]
    return quiet or every


def run_summary(records: list[Any]) -> dict[str, Any]:
    """How disturbed the measured repetitions of ``records`` (trial records) were, all together."""
    parts = [r.extra.get(KEY) for r in records if r.extra.get(KEY)]
    return {"repetitions": sum(p["repetitions"] for p in parts), "disturbed": sum(p["disturbed"] for p in parts),
            "replaced": sum(p.get("replaced", 0) for p in parts)}


def text(summary: dict[str, Any], pick_disturbed: int = 0) -> str | None:
    """One line for people: how disturbed the run was, and a warning when the pick rests on disturbed figures."""
    if not summary.get("repetitions"):
        return None
    replaced = f", {summary['replaced']} of them replaced by a new repetition" if summary["replaced"] else ""
    line = f"{summary['disturbed']} of {summary['repetitions']} repetitions disturbed by other processes{replaced}."
    if pick_disturbed:
        line += (f" Warning: the recommendation's figures include {pick_disturbed} disturbed repetition(s); "
                 "run again on a quieter machine to confirm it.")
    return line


def kept_disturbed(records: list[Any]) -> int:
    """Disturbed repetitions the figures pooled from ``records`` (one config's trials) still rest on: those
    whose position is known count only when no repetition was undisturbed (:func:`undisturbed` leaves them
    out otherwise); older records' kept ones always count."""
    parts = [r.extra[KEY] for r in records if r.extra.get(KEY)]
    older = sum(p["disturbed"] - p.get("replaced", 0) for p in parts if KEPT_AT not in p)
    known = sum(len(kept_at(r)) for r in records)
    return older + (known if known >= sum(r.request.n for r in records if r.request) else 0)
