"""``grid.py --busy``: a machine that stays busy, tuned as it is (issue 41).

A steady load (:class:`Busy`: one process at nice 19 spinning on one CPU, the last this process may use)
runs through every tuning run *and* through the re-measurement that judges it, since the user keeps the busy
machine: the recommendation is worth what it gives under the load it was tuned under. For each budget and
seed, ``tune()`` runs under the load into a fresh study; then each seed's recommendation and llama.cpp's own
defaults (what a user gets without autotune) are measured again under the same load, interleaved (``--rounds``
rounds, the order alternating). The figure per seed is the defaults' request time over the recommendation's
(median over rounds): how many times sooner a request is answered on the busy machine. Goal: at least
:data:`GOAL` in every seed. No grid is measured: its optimum is a quiet machine's.

Usage: ``python benchmarks/grid.py --busy [--budgets 2m] [--seeds 3] [--rounds 3]``
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import common as C

from tuner.backends.settings import TrialSettings, defaults
from tuner.cli.render import short_settings
from tuner.config.workloads import Workload
from tuner.search.options import grace_s

GOAL = 1.3  # the recommendation answers a request at least this many times sooner than the defaults, busy
DEFAULTS = "llama.cpp defaults"


class Busy(C.LoadProcess):
    """A steady background load: one process at nice 19 keeping one CPU busy (the last this process may use),
    from ``__enter__`` until ``__exit__``. A compile or a batch job the user left running looks like this."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu = max(os.sched_getaffinity(0))

    def code(self) -> str:
        """Lower its own priority, then spin."""
        return "import os\nos.nice(19)\nwhile True:\n    pass\n"

    def __enter__(self) -> "Busy":
        super().__enter__()
        os.sched_setaffinity(self.process.pid, {self.cpu})
        return self


def run(machine: C.Machine, budgets: list[float], seeds: int, rounds: int, reps: int, space: Path,
        workload: Workload, model: str | None = None) -> int:
    """Tune ``model`` (default: the bundled one; ``machine.model`` is the same file) under the load for each budget and seed, re-measure each pick against the defaults under the same
    load, and print the ratios and the goal; 0 when every run finished (the goal is reported, not enforced)."""
    base = defaults("llama_cpp", machine.profile.n_cpus, workload.needed_ctx())
    for budget in budgets:
        picks: dict[str, TrialSettings] = {}
        for seed in range(seeds):
            with Busy():
                tuned = C.run_tune(budget, space, workload.name, reps, seed, model=model)
            name = f"{budget:.0f}s seed {seed}"
            picks[name] = TrialSettings(**tuned.result.recommendation["settings"])
            promise = budget + grace_s(budget)
            print(f"busy {name}: {tuned.result.trials_run} trials, elapsed {tuned.wall_s:.1f}s (promise "
                  f"{promise:.0f}s: {'kept' if tuned.wall_s <= promise else 'BROKEN'}); recommends "
                  f"{short_settings(picks[name].model_dump())}", flush=True)
        with Busy():
            out = C.interleave(machine.model, {DEFAULTS: base, **picks}, workload, rounds, reps)
        report(budget, out, picks)
    return 0


def report(budget: float, out: dict[str, list[Any]], picks: dict[str, TrialSettings]) -> None:
    """Per seed, the defaults' request time over the pick's (median over paired rounds), then the goal."""
    speedups = []
    for name in picks:
        ratios = C.paired_ratios(out[name], out[DEFAULTS], "request_s")
        if ratios:
            speedups.append(C.median(ratios))
        print(f"busy {name}: request speed against the defaults under the same load "
              f"{C.spread(ratios, 'x') if ratios else 'n/a (a trial failed)'}")
    met = sum(s >= GOAL for s in speedups)
    print(f"busy {budget:.0f}s: recommendation / defaults, request speed under the load: {C.spread(speedups, 'x')}; "
          f"goal (>= {GOAL:g}x) met by {met} of {len(picks)} seeds")
