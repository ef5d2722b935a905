"""Warm start across machines: the seconds a new profile needs to reach a good request time when it
starts from a similar stored profile, against starting cold, side by side in one run.

1. A source run tunes the whole machine (every CPU of this process) for ``--source-budget`` into a
   SQLite database: that is the "other machine" whose trials are stored.
2. For each seed, the same machine restricted to one CPU (``cpus=[0]``, autotune's CPU pinning; a
   second profile) is tuned twice for ``--budget``, in alternating order:
   *cold* into an empty database, *warm* into a copy of the source database, so its first search
   trial is the best config of the source profile with its threads scaled to one CPU.
3. Per pair: the cold run's final request time (its recommendation under the request-time
   objective) is the target; for each run, the seconds from its start until a finished trial's
   request time came within ``--tolerance`` of that target. The figure is the warm/cold ratio of
   those seconds (below 1: the warm start got there sooner), median and spread over the seeds.

Usage: ``python benchmarks/warmstart.py [--quick] [--source-budget 2m] [--budget 90s] [--seeds 3]``
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402

from tuner.util.units import parse_duration  # noqa: E402
from tuner.config.workloads import get_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__)
    p.add_argument("--source-budget", help="tuning budget of the whole machine (default 2m; --quick: 20s)")
    p.add_argument("--budget", help="budget of each one-CPU run (default 90s; --quick: 15s)")
    p.add_argument("--seeds", type=int, help="cold/warm pairs (default 3; --quick: 1)")
    p.add_argument("--space", type=Path, help="search space (default: search_spaces/llama-cpp.yaml)")
    p.add_argument("--tolerance", type=float, default=0.03, help="how close to the target counts (default 3%%)")
    p.add_argument("--repetitions", type=int, help="timed repetitions per trial (default 3; --quick: 1)")
    a = p.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        print("warm start needs 2 CPUs: the one-CPU profile must differ from the source profile", file=sys.stderr)
        return 2
    source_budget = parse_duration(a.source_budget or ("20s" if a.quick else "2m"))
    budget = parse_duration(a.budget or ("15s" if a.quick else "90s"))
    seeds, reps = a.seeds or (1 if a.quick else 3), a.repetitions or (1 if a.quick else 3)
    space = a.space or (C.SPACES_DIR / "quick.yaml" if a.quick else C.ROOT / "search_spaces" / "llama-cpp.yaml")
    workload = get_workload("tiny" if a.quick else "default").name
    machine = C.Machine.detect()
    C.header("warm start: seconds to the cold run's final request time, warm against cold", machine,
             search_space=space, workload=workload, source_run=f"{source_budget:.0f}s on every CPU",
             one_cpu_runs=f"{seeds} cold/warm pairs, {budget:.0f}s each, cpus=[0], {reps} repetitions per trial",
             target=f"within {a.tolerance:.0%} of the cold run's final request time")
    with tempfile.TemporaryDirectory(prefix="autotune-warmstart-") as tmp:
        source = Path(tmp) / "source.db"
        run = C.run_tune(source_budget, space, workload, reps, 100, url=f"sqlite:///{source}")
        final = run.best()
        print(f"source run: {len(run.timeline)} trials in {run.wall_s:.1f}s, final request "
              f"{final.request.median:.3f} s" if final and final.request else f"source run: {run.wall_s:.1f}s, no request time")
        ratios, cold_s, warm_s = [], [], []
        for seed in range(seeds):
            runs: dict[str, C.TuneRun] = {}
            for kind in (("cold", "warm") if seed % 2 == 0 else ("warm", "cold")):
                db = Path(tmp) / f"{kind}-{seed}.db"
                if kind == "warm":
                    shutil.copy(source, db)
                runs[kind] = C.run_tune(budget, space, workload, reps, seed, url=f"sqlite:///{db}", cpus=[0])
            cold = runs["cold"].best()
            if cold is None or cold.request is None:
                print(f"seed {seed}: the cold run measured no request time")
                continue
            target = cold.request.median
            reached = {kind: run.seconds_to(target * (1 + a.tolerance)) for kind, run in runs.items()}
            line = "; ".join(
                f"{kind} {'not reached' if reached[kind] is None else f'{reached[kind]:.1f}s'} ({len(run.timeline)} "
                f"trials{', warm start queued' if run.warm_started else ''})" for kind, run in runs.items())
            print(f"seed {seed}: target {target:.3f} s; {line}")
            if reached["cold"] is not None:
                cold_s.append(reached["cold"])
                # never reaching the target counts as the whole run: an upper bound on the warm run's time
                warm_s.append(reached["warm"] if reached["warm"] is not None else runs["warm"].wall_s)
                ratios.append(warm_s[-1] / reached["cold"])
    print(f"cold: seconds to target {C.spread(cold_s, ' s', 1)}")
    print(f"warm: seconds to target {C.spread(warm_s, ' s', 1)}")
    print(f"seconds to target, warm / cold: {C.spread(ratios, 'x')} [per-seed ratios]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
