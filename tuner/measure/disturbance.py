"""How disturbed each timed repetition was, and what a run does about it.

A repetition measured while another process ran on the machine (a build, a browser, another
benchmark, or the hypervisor giving the CPU to another VM: steal time) is slower for a reason that has
nothing to do with the config. The trial's child watches every repetition: the CPU time the whole
machine spent busy (``/proc/stat`` through psutil, steal included; only the CPUs the process may run
on, when it is pinned to some) minus the time its own threads used, and the load average. A repetition in which other processes took more than
``DISTURBED_SHARE`` of one CPU on average is *disturbed*: the child runs one more repetition in its
place (at most ``MAX_REPEATS`` per trial) and leaves the disturbed one out of its figures, so a trial
still reports the repetitions it was asked for. The run summary and the recommendation say how many
repetitions were disturbed and whether the pick rests on disturbed figures.

Each phase of a repetition (its prefill, its decode, the decode at depth) is watched on its own too:
a neighbour busy 2-8 s at a time disturbs nearly every 8-s repetition on a slow 2-vCPU machine, but
leaves many of its 3-s phases alone. A figure rests on the repetitions whose own phase was quiet, and a
request time may be put together from one repetition's quiet prefill and another's quiet decode
(:func:`quiet_requests`).

After a disturbed repetition (or a disturbed warmup) the child waits for the machine to be quiet before
the next one (:func:`wait_for_quiet`: at most ``MAX_WAIT_S`` at a time, ``MAX_WAIT_PER_TRIAL_S`` per
trial, and ``WAIT_SHARE`` of the run's budget in all, :mod:`tuner.measure.load`), so a neighbour that
works in bursts is measured around rather than into: a repetition started
while it is busy is disturbed, and a disturbed 2-thread decode runs up to 4x longer, which makes the
next repetition more likely to meet the next burst too. A quiet machine never waits.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil

DISTURBED_SHARE = 0.25   # other processes took a quarter of one CPU on average during the repetition
MIN_OTHER_S = 0.05       # ... and at least this: /proc/stat counts in 10-ms ticks, a phase of 0.1 s could
                         # otherwise read as disturbed from the clock's grain alone
MAX_REPEATS = 2          # disturbed repetitions a trial replaces by new ones
KEY = "disturbance"      # the per-repetition list in a child's result, and the record's extra section
KEPT_AT = "kept_at"      # in a record's section: positions of the disturbed repetitions its figures kept
BY_PHASE = "kept_at_by_phase"  # ... and of those whose prefill / decode / decode at depth was disturbed
REQUEST_PHASES = "request_phases"  # ... and the phases a request is made of (its decode may be at depth)
WAITED = "waited_s"    # seconds a repetition (or a trial, in its section) waited for a quiet machine
QUIET_POLL_S = 0.25    # how often :func:`wait_for_quiet` looks at the machine
QUIET_POLLS = 2        # ... and how many quiet looks in a row make it quiet
MAX_WAIT_S = 8.0       # the longest one wait (a build's burst, a neighbour busy a few seconds at a time)
MAX_WAIT_PER_TRIAL_S = 20.0  # a machine that never quiets down costs a trial at most this
PHASES = ("prefill", "decode", "decode_depth")
FIGURE_PHASE = {"prefill": "prefill", "ttft": "prefill", "decode": "decode", "decode_depth": "decode_depth"}


def _busy(t: Any) -> tuple[float, float]:
    steal = getattr(t, "steal", 0.0)
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + steal, steal


def _machine_busy_s() -> tuple[float, float]:
    """(CPU seconds busy since boot on the CPUs this process may run on, of which stolen by the hypervisor).

    A process pinned to some CPUs (``--cpus``, or a parent's affinity) is disturbed by what runs on those
    CPUs, not by a neighbour on the others; unpinned, that is the whole machine. (A neighbour elsewhere
    still shares caches and memory bandwidth: this watch does not see that.)
    """
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    per_cpu = psutil.cpu_times(percpu=True)
    if not mine or len(per_cpu) != os.cpu_count() or len(mine) == len(per_cpu):
        return _busy(psutil.cpu_times())
    parts = [_busy(t) for cpu, t in enumerate(per_cpu) if cpu in mine]
    return sum(b for b, _ in parts), sum(s for _, s in parts)


_helpers: dict[int, psutil.Process] = {}  # processes whose work is this process's own: see count_as_own()


def count_as_own(pid: int) -> None:
    """Count process ``pid``'s CPU time (a trial's llama-server) as this process's own work while it lives."""
    try:
        _helpers[pid] = psutil.Process(pid)
    except psutil.Error:
        pass


def _own_s() -> float:
    """CPU seconds of this process and of the helpers it counts as its own (:func:`count_as_own`)."""
    total = sum(psutil.Process().cpu_times()[:2])
    for pid, helper in list(_helpers.items()):
        try:
            c = helper.cpu_times()
        except psutil.Error:  # ended: its time no longer moves (the readings before and after both lack it)
            del _helpers[pid]
            continue
        total += c.user + c.system
    return total


def _now() -> tuple[float, float, float, float]:
    """(monotonic time, machine busy CPU seconds, of which stolen, this process's CPU seconds)."""
    busy, steal = _machine_busy_s()
    return time.monotonic(), busy, steal, _own_s()


def _disturbed(wall: float, other: float) -> bool:
    """Whether other processes taking ``other`` CPU seconds in ``wall`` seconds disturbed that time."""
    return other > MIN_OTHER_S and other / wall > DISTURBED_SHARE


def _other_s(since: tuple[float, float, float, float], now: tuple[float, float, float, float]) -> tuple[float, float]:
    """(wall seconds, CPU seconds other processes took) between two :func:`_now` readings."""
    wall = max(now[0] - since[0], 1e-6)
    return wall, max((now[1] - since[1]) - (now[3] - since[3]), 0.0)


class Watch:
    """Watches one repetition of this process: :meth:`start` before it, :meth:`phase` after each of its
    phases (optional), :meth:`stop` after it."""

    def __init__(self) -> None:
        self._start: tuple[float, float, float, float] | None = None
        self._mark: tuple[float, float, float, float] | None = None
        self._phases: dict[str, bool] = {}
        self._waited = 0.0

    def start(self, waited_s: float = 0.0) -> None:
        """Note the machine's and this process's CPU time now (and, for the record, the ``waited_s`` seconds
        waited for a quiet machine before it)."""
        self._start = self._mark = _now()
        self._phases = {}
        self._waited = waited_s

    def phase(self, name: str) -> None:
        """The phase ``name`` of the repetition (e.g. "prefill") ended: note whether other processes took
        more than ``DISTURBED_SHARE`` of a CPU since the previous phase ended (or the repetition began)."""
        if self._mark is None:
            return
        now = _now()
        wall, other = _other_s(self._mark, now)
        self._phases[name] = _disturbed(wall, other)
        self._mark = now

    def stop(self, request_phases: tuple[str, ...] = ("prefill", "decode")) -> dict[str, Any] | None:
        """What other processes took since :meth:`start` (None if it was not started). With phases
        watched, the repetition is disturbed when one of ``request_phases`` (the phases its request
        time is made of) was; without, when the whole repetition was."""
        if self._start is None:
            return None
        now = _now()
        wall, other = _other_s(self._start, now)
        out = {"wall_s": round(wall, 3), "other_cpu_s": round(other, 3), "steal_s": round(now[2] - self._start[2], 3),
               "load1": round(os.getloadavg()[0], 2), "disturbed": _disturbed(wall, other)}
        if self._waited:
            out[WAITED] = round(self._waited, 3)
        if self._phases:
            out.update(phases=dict(self._phases), disturbed=any(self._phases.get(p, False) for p in request_phases))
            out[REQUEST_PHASES] = list(request_phases)
        self._start = self._mark = None
        return out


def wait_for_quiet(limit_s: float = MAX_WAIT_S) -> float:
    """Wait, at most ``limit_s`` seconds, until ``QUIET_POLLS`` looks in a row, ``QUIET_POLL_S`` apart, find
    the machine undisturbed (the rule a repetition is judged by: :func:`_disturbed`); the seconds waited.
    This process sleeps meanwhile (its own CPU time is left out, as in :class:`Watch`)."""
    start = mark = _now()
    quiet = 0
    while quiet < QUIET_POLLS and mark[0] - start[0] < limit_s:
        time.sleep(min(QUIET_POLL_S, max(limit_s - (mark[0] - start[0]), 0.01)))
        now = _now()
        quiet = 0 if _disturbed(*_other_s(mark, now)) else quiet + 1
        mark = now
    return round(mark[0] - start[0], 3)


def wait_left(watched: list[dict[str, Any]], allowed_s: float = MAX_WAIT_PER_TRIAL_S) -> float:
    """Seconds the next repetition may wait for a quiet machine, after the repetitions ``watched`` so far:
    none after a quiet one (a quiet machine never waits), else up to ``MAX_WAIT_S`` of what is left of
    ``MAX_WAIT_PER_TRIAL_S``, and of ``allowed_s`` (the run's share of its budget left for waiting,
    :mod:`tuner.measure.load`)."""
    if not watched or not watched[-1].get("disturbed"):
        return 0.0
    cap = min(MAX_WAIT_PER_TRIAL_S, allowed_s)
    return max(min(MAX_WAIT_S, cap - sum(d.get(WAITED, 0.0) for d in watched)), 0.0)


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
    kept_reps = [d for d in per_repetition if not d.get("replaced")]
    kept = [i for i, d in enumerate(kept_reps) if d.get("disturbed")]
    out = {"repetitions": len(per_repetition), "disturbed": disturbed, "replaced": replaced,
           "other_cpu_share": round(sum(d["other_cpu_s"] for d in per_repetition) / wall, 3) if wall else 0.0,
           **({KEPT_AT: kept} if kept else {})}
    waited = sum(d.get(WAITED, 0.0) for d in per_repetition)
    if waited:
        out[WAITED] = round(waited, 3)
    phased = [d for d in kept_reps if "phases" in d]
    if phased and len(phased) == len(kept_reps):  # every kept repetition's phases were watched
        out[BY_PHASE] = {name: [i for i, d in enumerate(kept_reps) if d["phases"].get(name)] for name in PHASES}
        out[REQUEST_PHASES] = phased[0][REQUEST_PHASES]
    return out


def kept_at(record: Any) -> set[int]:
    """Positions, in a trial record's per-repetition figures, of the disturbed repetitions it kept (no
    replacement was left); none known for records written before the positions were stored."""
    return set((record.extra.get(KEY) or {}).get(KEPT_AT, ()))


def _disturbed_at(record: Any, figure: str) -> set[int]:
    """Positions of ``record``'s kept repetitions whose ``figure`` was taken while the machine was busy: its
    own phase where the phases were watched, else the whole repetition."""
    section = record.extra.get(KEY) or {}
    by_phase, phase = section.get(BY_PHASE), FIGURE_PHASE.get(figure)
    if by_phase is not None and phase is not None:
        return set(by_phase.get(phase, ()))
    return kept_at(record)


def undisturbed(records: list[Any], figure: str) -> list[float]:
    """The samples of ``figure`` (a record field: "prefill", "decode", "request", ...) that ``records`` took
    on an undisturbed machine, or all of them when every one was disturbed: a config's figures rest on
    its quiet repetitions wherever it has any, so a busy neighbour can neither sink nor crown it. A
    request time may be put together from quiet phases (:func:`quiet_requests`)."""
    every = [s for record in records if getattr(record, figure) for s in getattr(record, figure).samples]
    if figure == "request":
        return quiet_requests(records) or every
    quiet = []
    for record in records:
        stat, disturbed = getattr(record, figure), _disturbed_at(record, figure)
        if stat:
            quiet += [s for i, s in enumerate(stat.samples) if i not in disturbed]
    return quiet or every


def quiet_requests(records: list[Any]) -> list[float]:
    """Request times of ``records`` (one config's trials) taken on a quiet machine: each repetition quiet
    throughout, then one per pair of a repetition whose prefill alone was quiet and one whose decode alone
    was (its time to the first token plus the other's decode time: the request time is exactly that sum)."""
    quiet: list[float] = []
    prefills: list[float] = []
    decodes: list[float] = []
    for record in records:
        if not record.request:
            continue
        section = record.extra.get(KEY) or {}
        by_phase, request = section.get(BY_PHASE), record.request.samples
        if by_phase is None or not record.ttft or record.ttft.n != record.request.n:
            quiet += [s for i, s in enumerate(request) if i not in kept_at(record)]
            continue
        busy_prefill = _disturbed_at(record, "prefill")
        busy_decode = {i for p in section.get(REQUEST_PHASES, ("prefill", "decode")) if p != "prefill"
                       for i in _disturbed_at(record, p)}
        for i, seconds in enumerate(request):
            if i not in busy_prefill and i not in busy_decode:
                quiet.append(seconds)
            elif i not in busy_prefill:
                prefills.append(record.ttft.samples[i])
            elif i not in busy_decode:
                decodes.append(seconds - record.ttft.samples[i])
    return quiet + [round(p + d, 4) for p, d in zip(prefills, decodes)]


def run_summary(records: list[Any]) -> dict[str, Any]:
    """How disturbed the measured repetitions of ``records`` (trial records) were, all together."""
    parts = [r.extra.get(KEY) for r in records if r.extra.get(KEY)]
    return {"repetitions": sum(p["repetitions"] for p in parts), "disturbed": sum(p["disturbed"] for p in parts),
            "replaced": sum(p.get("replaced", 0) for p in parts),
            WAITED: round(sum(p.get(WAITED, 0.0) for p in parts), 1)}


def text(summary: dict[str, Any], pick_disturbed: int = 0) -> str | None:
    """One line for people: how disturbed the run was, and a warning when the pick rests on disturbed figures."""
    if not summary.get("repetitions"):
        return None
    replaced = f", {summary['replaced']} of them replaced by a new repetition" if summary["replaced"] else ""
    waited = (f"; {summary[WAITED]:.0f} s waited for the machine to quiet down" if summary.get(WAITED, 0) >= 0.5
              else "")
    line = f"{summary['disturbed']} of {summary['repetitions']} repetitions disturbed by other processes{replaced}{waited}."
    if pick_disturbed:
        line += (f" Warning: the recommendation's figures include {pick_disturbed} disturbed repetition(s); "
                 "run again on a quieter machine to confirm it.")
    return line


def kept_disturbed(records: list[Any]) -> int:
    """Disturbed repetitions the request time pooled from ``records`` (one config's trials) still rests on:
    those whose position is known count only when no request time was quiet, not even one put together
    from quiet phases (:func:`undisturbed` leaves them out otherwise); older records' kept ones always count."""
    parts = [r.extra[KEY] for r in records if r.extra.get(KEY)]
    older = sum(p["disturbed"] - p.get("replaced", 0) for p in parts if KEPT_AT not in p)
    known = sum(len(kept_at(r)) for r in records)
    return older + (0 if quiet_requests(records) else known)
