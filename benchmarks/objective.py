"""Request time against the geometric mean: which config each objective picks, and how long a request
then takes, re-measured side by side.

1. ``tune()`` searches the default space (both backends) for ``--budget`` into a fresh study.
2. From the same pooled configs, the config the request-time objective picks (autotune's default)
   and the config the geometric mean of prefill and decode picks (the old default) are taken.
3. Both are measured again in alternating order (A B, B A, ...), ``--rounds`` trials each; the
   figure is one request of the workload (time to first token + the decode of the answer), median
   and spread, and the per-round ratio geometric-mean pick / request-time pick.

Usage: ``python benchmarks/objective.py [--quick] [--budget 3m] [--rounds 4]``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402

from tuner.selection import decision  # noqa: E402
from tuner.backends.settings import TrialSettings  # noqa: E402
from tuner.util.units import parse_duration  # noqa: E402
from tuner.config.workloads import get_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__)
    p.add_argument("--budget", help="tuning budget (default 3m; --quick: 20s)")
    p.add_argument("--space", type=Path, help="search space (default: search_spaces/cpu.yaml, both backends)")
    p.add_argument("--rounds", type=int, help="paired re-measurements (default 4; --quick: 1)")
    p.add_argument("--repetitions", type=int, help="timed repetitions per trial (default 3; --quick: 1)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    budget = parse_duration(a.budget or ("20s" if a.quick else "3m"))
    space = a.space or (C.SPACES_DIR / "quick.yaml" if a.quick else C.ROOT / "search_spaces" / "cpu.yaml")
    rounds, reps = a.rounds or (1 if a.quick else 4), a.repetitions or (1 if a.quick else 3)
    workload = get_workload("tiny" if a.quick else "default")
    machine = C.Machine.detect()
    C.header("request time: the request-time pick against the geometric-mean pick", machine,
             workload=f"{workload.name} ({workload.prompt_tokens} prompt / {workload.generate_tokens} generated)",
             search_space=space, tuning_budget=f"{budget:.0f}s",
             re_measurement=f"{rounds} alternating rounds x 2 configs, {reps} repetitions per trial")
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    run = C.run_tune(budget, space, workload.name, reps, a.seed, a.cache_dir / "objective-recommendation.yaml")
    cands = run.candidates
    picks = {"request-time pick": decision.best(cands, "request_time"), "geometric-mean pick": decision.best(cands, "balanced")}
    print(f"tuning: {run.result.trials_run} trials in {run.wall_s:.1f}s, {len(cands)} measured configs")
    for name, cand in picks.items():
        print(f"{name:<20} {cand.config_key}")
    if picks["request-time pick"].config_key == picks["geometric-mean pick"].config_key:
        print("both objectives pick the same config here: the ratio is 1 by construction")
    configs = {name: TrialSettings(**cand.settings) for name, cand in picks.items()}
    out = C.interleave(machine.model, configs, workload, rounds, reps)
    for name, outcomes in out.items():
        print(f"{name:<20} request {C.spread(C.samples(outcomes, 'request_s'), ' s', 2)}; prefill "
              f"{C.spread(C.samples(outcomes, 'prefill_tps'), ' t/s', 1)}; decode "
              f"{C.spread(C.samples(outcomes, 'decode_tps'), ' t/s', 1)}")
    ratios = C.paired_ratios(out["request-time pick"], out["geometric-mean pick"], "request_s")
    print(f"request time, geometric-mean pick / request-time pick: {C.spread(ratios, 'x')} [per-round ratios]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
