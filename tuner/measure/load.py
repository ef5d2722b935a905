"""The machine's load when a run starts: how much of the run's CPUs other processes keep busy (issue 41).

A neighbour that works in bursts is measured around (:mod:`tuner.measure.disturbance` waits for a quiet
machine and replaces a disturbed repetition). A neighbour that keeps a share of the CPUs through the
run (a build at nice 19, another tenant's service) is not a burst: every repetition is disturbed,
waiting for quiet only spends the budget, and the best config is the best one *under that load*
(on a busy 2-CPU machine one thread may beat two). So a run measures the load once before its first
trial (:func:`probe`: /proc/stat over ``PROBE_S`` seconds, this process's own CPU time left out), says
so when the machine is busy, and tunes the machine as it is:

* its waiting for a quiet machine is bounded by ``WAIT_SHARE`` of the budget in all (:func:`wait_budget_s`);
* the informed start runs on the CPUs left free (:meth:`MachineLoad.free_cpus`) and the screening changes
  the thread counts first, fewer threads than CPUs first (:mod:`tuner.search.refine`);
* every trial record keeps the load its run started under (``extra[KEY]``), and the recommendation says
  which load its figures were measured under, and whether they mix a busy run's with a quiet run's.

:func:`of_readings` is the pure rule (tests feed it numbers); :func:`probe` measures it for real.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from . import disturbance

PROBE_S = 1.0        # how long the start probe watches the machine
BUSY_CPUS = disturbance.DISTURBED_SHARE  # busy: others keep more than this share of one CPU busy on average
                                         # (what disturbs a repetition, :func:`tuner.measure.disturbance._disturbed`)
WAIT_SHARE = 0.15    # a run waits for a quiet machine at most this share of its budget in all
KEY = "machine_load"  # a trial record's extra section, and the recommendation's section


@dataclass(frozen=True)
class MachineLoad:
    """What other processes took of the run's ``cpus`` CPUs over ``seconds``: ``other_cpus`` CPUs on average."""

    other_cpus: float
    cpus: int
    seconds: float = PROBE_S

    @property
    def busy(self) -> bool:
        """Whether other processes keep enough of the CPUs busy to disturb every repetition."""
        return self.other_cpus > BUSY_CPUS

    @property
    def share(self) -> float:
        """The share of the run's CPUs other processes keep busy (0..1)."""
        return min(self.other_cpus / self.cpus, 1.0) if self.cpus else 0.0

    def free_cpus(self) -> int:
        """The CPUs left to the run, at least one; on a busy machine fewer than all of them."""
        free = max(1, round(self.cpus - self.other_cpus))
        return min(free, self.cpus - 1) if self.busy and self.cpus > 1 else min(free, self.cpus)

    def public(self) -> dict[str, Any]:
        """Plain data for a trial record or a recommendation."""
        return {"other_cpus": round(self.other_cpus, 2), "cpus": self.cpus, "share": round(self.share, 3),
                "busy": self.busy, "probe_s": round(self.seconds, 2)}

    @classmethod
    def of(cls, data: dict[str, Any]) -> "MachineLoad":
        """Back from :meth:`public`."""
        return cls(float(data.get("other_cpus", 0.0)), int(data.get("cpus", 1)), float(data.get("probe_s", PROBE_S)))

    def text(self, budget_s: float | None = None) -> str:
        """One line for people: the load measured and, when busy, what the run does about it."""
        measured = (f"other processes kept {self.other_cpus:.1f} of this run's {self.cpus} CPU(s) busy "
                    f"({self.share:.0%}) over {self.seconds:.0f} s")
        if not self.busy:
            return f"the machine is quiet at the start: {measured}"
        wait = f"at most {wait_budget_s(budget_s):.0f} s" if budget_s else f"at most {WAIT_SHARE:.0%} of the budget"
        return (f"the machine is busy at the start: {measured}; it is tuned as it is: {wait} in all is waited for "
                f"a quiet moment, thread counts are screened first (from {self.free_cpus()} thread(s)), and the "
                "recommendation records this load")


    def tuned_text(self) -> str:
        """One line for a recommendation: the load its figures were measured under."""
        measured = f"other processes kept {self.other_cpus:.1f} of its {self.cpus} CPU(s) busy ({self.share:.0%})"
        if not self.busy:
            return f"Tuned on a quiet machine ({measured})."
        return (f"Tuned on a busy machine: {measured} when the run started; these figures and settings are the best "
                "under that load, and a quiet machine may prefer other settings (more threads).")


def of_readings(wall_s: float, other_cpu_s: float, cpus: int) -> MachineLoad:
    """The load of ``other_cpu_s`` CPU seconds other processes took on ``cpus`` CPUs in ``wall_s`` seconds."""
    wall = max(wall_s, 1e-6)
    return MachineLoad(other_cpus=max(other_cpu_s, 0.0) / wall, cpus=max(int(cpus), 1), seconds=wall)


def probe(cpus: int, seconds: float = PROBE_S) -> MachineLoad:
    """Measure the load: the CPU seconds the run's CPUs were busy over ``seconds`` (those this process may
    run on, :func:`tuner.measure.disturbance._machine_busy_s`), less this process's own, while it sleeps."""
    start = disturbance._now()
    time.sleep(seconds)
    wall, other = disturbance._other_s(start, disturbance._now())
    return of_readings(wall, other, cpus)


def wait_budget_s(budget_s: float) -> float:
    """Seconds a run of ``budget_s`` may wait for a quiet machine in all (``WAIT_SHARE`` of it)."""
    return WAIT_SHARE * budget_s


def of_record(record: Any) -> MachineLoad | None:
    """The load a trial record's run started under (None for a record written before it was kept)."""
    data = record.extra.get(KEY)
    return MachineLoad.of(data) if data else None


def classes(records: list[Any]) -> set[bool]:
    """The load classes (busy: True, quiet: False) ``records`` were measured under, where known."""
    return {load.busy for load in map(of_record, records) if load is not None}


def mixed_text(records: list[Any], what: str = "these figures") -> str | None:
    """A line when ``records`` mix trials of a busy run with trials of a quiet one; None otherwise."""
    loads = [load for load in map(of_record, records) if load is not None]
    busy = [load for load in loads if load.busy]
    if not busy or len(busy) == len(loads):
        return None
    return (f"{what} pool {len(busy)} trial(s) measured on a busy machine (others kept up to "
            f"{max(b.other_cpus for b in busy):.1f} CPU(s) busy) with {len(loads) - len(busy)} measured on a quiet one: "
            "a config's speed differs between the two; tune again on the machine as it will serve")
