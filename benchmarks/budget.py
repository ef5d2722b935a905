"""Budget adherence: does ``autotune run --budget X`` end within its promise, X + max(10% of X, 30 s)?

For each budget (default 60s and 2m, ``--runs`` 3 times each; ``--quick``: 20s and 40s, once) the
real command line runs in a subprocess, ``autotune run --budget X`` with a fresh SQLite database
and results folder, timed from the outside (interpreter start to exit, what a user waits). The
tuner stops starting trials when the budget (minus a re-measurement reserve) is spent and stops a
trial still running at the deadline, keeping the repetitions it finished; only a study's very first
baseline may run past it. Each run's line gives its overrun; a summary line per budget gives the
median wall time and its spread over the runs.

``--api`` calls ``tuner.search.tune.tune()`` in the subprocess instead of the command line.

Usage: ``python benchmarks/budget.py [--quick] [--budgets 60s,2m,10m] [--runs 3]``
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402
import optuna  # noqa: E402

from tuner.util.paths import cache_dir  # noqa: E402
from tuner.selection.candidates import records  # noqa: E402
from tuner.results.storage import open_storage  # noqa: E402
from tuner.search.options import grace_s  # noqa: E402
from tuner.util.units import parse_duration  # noqa: E402

API = ("import sys; from tuner.search.tune import TuneOptions, tune; a = sys.argv[1:]; "
       "r = tune(TuneOptions(budget_s=float(a[0]), space=a[1], storage=a[2], workload=a[3], "
       "repetitions=int(a[4]), trial_timeout_s=float(a[5]), "
       "max_quality_loss=None if a[6] == 'none' else float(a[6]))); "
       "print(f'study {r.study_name}: {r.trials_run} trial(s) in {r.elapsed_s:.1f}s')")


def command(budget_s: float, space: Path, url: str, workload: str, reps: int, timeout_s: float,
            api: bool) -> list[str]:
    """The subprocess that tunes: the ``autotune run`` command line, or ``tune()`` with ``api``."""
    if api:
        return [sys.executable, "-c", API, str(budget_s), str(space), url, workload, str(reps), str(timeout_s),
                str(C.quality_gate() or "none")]
    args = ["run", "--budget", f"{budget_s:g}s", "--space", str(space), "--storage", url, "--workload", workload,
            "--repetitions", str(reps), "--trial-timeout", f"{timeout_s:g}s", "--seed", "0"]
    if C.quality_gate() is None:
        args += ["--max-quality-loss", "none"]
    return [sys.executable, "-c", "from tuner.cli import main; main()", *args]


def run_one(budget_s: float, space: Path, workload: str, reps: int, timeout_s: float, api: bool) -> dict:
    """One budgeted run, timed from outside; its trials' wall times are read from its database."""
    with tempfile.TemporaryDirectory(prefix="autotune-budget-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'budget.db'}"
        env = {**os.environ, "AUTOTUNE_RESULTS": str(Path(tmp) / "results"),
               "AUTOTUNE_CACHE_DIR": str(cache_dir().resolve())}  # keep quantized variants between runs
        start = time.monotonic()
        proc = subprocess.run(command(budget_s, space, url, workload, reps, timeout_s, api), env=env,
                              capture_output=True, text=True, check=False, cwd=C.ROOT)
        elapsed = time.monotonic() - start
        if proc.returncode != 0:
            raise SystemExit(f"the tuning run failed (status {proc.returncode}):\n{proc.stderr[-2000:]}")
        rdb = open_storage(url).rdb
        (summary,) = optuna.get_all_study_summaries(rdb)
        recs = [rec for _, rec in records(optuna.load_study(study_name=summary.study_name, storage=rdb))]
    walls = [r.outcome.wall_s for r in recs if r.outcome.wall_s]
    longest = max(recs, key=lambda r: r.outcome.wall_s or 0.0, default=None)
    match = re.search(r"trial\(s\)\s+in\s+(?:(\d+)h)?(?:(\d+)m)?(?:([\d.]+)s)?", proc.stdout)  # rich may wrap
    inside = sum(float(v or 0) * k for v, k in zip(match.groups(), (3600, 60, 1))) if match else None
    return {"elapsed": elapsed, "trials": len(recs), "walls": walls, "inside": inside,
            "longest_role": longest.role if longest else "none"}


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__)
    p.add_argument("--budgets", help="comma-separated budgets (default 2m,5m; --quick: 20s,40s)")
    p.add_argument("--trial-timeout", help="trial timeout (default 300s, the CLI's; --quick: 30s)")
    p.add_argument("--space", type=Path, help="search space (default: the llama.cpp space)")
    p.add_argument("--workload", help="workload (default: default; --quick: tiny)")
    p.add_argument("--repetitions", type=int, help="timed repetitions per trial (default 3; --quick: 1)")
    p.add_argument("--api", action="store_true", help="call tune() instead of the autotune command line")
    p.add_argument("--runs", type=int, help="runs per budget (default 3; --quick: 1)")
    a = p.parse_args(argv)
    budgets = [parse_duration(b) for b in (a.budgets or ("20s,40s" if a.quick else "60s,2m")).split(",")]
    runs = a.runs or (1 if a.quick else 3)
    timeout = parse_duration(a.trial_timeout or ("30s" if a.quick else "300s"))
    space = a.space or (C.SPACES_DIR / "quick.yaml" if a.quick else C.default_space())
    workload = a.workload or ("tiny" if a.quick else "default")
    reps = a.repetitions or (1 if a.quick else 3)
    machine = C.Machine.detect()
    C.header("budget adherence", machine, runs=("tune() in a subprocess" if a.api else "autotune run, a subprocess")
             + f", space {space.name}, workload {workload}, {reps} repetitions per trial",
             quality_gate=C.quality_gate() or "off (tuner.backends.llama_cpp.quant cannot measure perplexity yet)")
    ok = True
    for budget in budgets:
        promise = budget + grace_s(budget)
        elapsed = []
        for i in range(runs):
            C.log(f"running with a {budget:.0f}s budget ({i + 1}/{runs}) ...")
            r = run_one(budget, space, workload, reps, timeout, a.api)
            overrun = r["elapsed"] - budget
            within = r["elapsed"] <= promise
            ok &= within
            elapsed.append(r["elapsed"])
            trial = C.median(r["walls"])
            inside = "n/a" if r["inside"] is None else f"{r['inside']:.0f}s"
            print(f"budget {budget:.0f}s: elapsed {r['elapsed']:.1f}s, overrun {overrun:+.1f}s "
                  f"({overrun / trial:+.2f} median trials), {r['trials']} trials "
                  f"(median {trial:.1f}s, longest {max(r['walls'], default=0):.1f}s, a {r['longest_role']} trial); "
                  f"tuner's own elapsed {inside}; within the promise ({promise:.0f}s): {'yes' if within else 'NO'}")
        print(f"budget {budget:.0f}s over {runs} run(s): wall time {C.spread(elapsed, 's', 1)}; promise {promise:.0f}s")
    # --quick runs beside the other benchmarks in the tests: its figures only show the script works.
    return 0 if ok or a.quick else 1


if __name__ == "__main__":
    sys.exit(main())
