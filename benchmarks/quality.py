"""Measurement quality: how repeatable a trial is, what share of it is overhead, trials per minute.

1. Repeatability: llama-cpp-python's default config is measured in ``--trials`` separate trials
   (each its own process, back to back). The CV of the trial medians says how far two trials of
   one config disagree, i.e. how large a difference the tuner can trust; the median within-trial
   CV says how much the repetitions inside one trial scatter.
2. Overhead, from the same trials: a trial's wall time (``TrialOutcome.wall_s``, seen by the
   parent) split into model load (``result['load_s']``), timed inference (``result['timed_s']``),
   the untimed warm-up (estimated from the trial's own speeds: one prefill plus 8 decode
   tokens), and the rest: interpreter start, imports, tokenizing the prompt, exit.
3. Throughput of a real tuning run: ``tune()`` for ``--budget`` (default 2m) in a fresh study;
   trials per minute of budget, and the share of the run's wall time spent inside trials (the
   rest is the tuner: profile, bandwidth probe, sampler, storage, quantizing).

Usage: ``python benchmarks/quality.py [--quick] [--trials 8] [--budget 2m]``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402

from tuner.measure import records as R  # noqa: E402
from tuner.backends.llama_cpp.backend import llama_cpp_defaults  # noqa: E402
from tuner.backends.protocol import WARMUP_DECODE  # noqa: E402
from tuner.backends.settings import config_key  # noqa: E402
from tuner.util.units import parse_duration  # noqa: E402
from tuner.config.workloads import get_workload  # noqa: E402


def breakdown(wall: float, result: dict) -> dict[str, float]:
    """A trial's wall time split into load, timed, warm-up (estimated) and the rest, in seconds."""
    prefill, decode = C.median(result["prefill_tps"]), C.median(result["decode_tps"])
    warmup = result["prompt_tokens"] / prefill + min(WARMUP_DECODE, result["generate_tokens"]) / decode
    load, timed = result["load_s"], result["timed_s"]
    return {"wall": wall, "load": load, "timed": timed, "warmup": warmup,
            "rest": max(wall - load - timed - warmup, 0.0)}


def print_breakdown(parts: list[dict[str, float]]) -> None:
    """Median seconds and share of wall time of each part over ``parts``."""
    print(f"trial wall time: {C.spread([p['wall'] for p in parts], ' s')}")
    for name, label in (("timed", "timed inference"), ("load", "model load"),
                        ("warmup", "warm-up (estimated)"), ("rest", "process start, imports, exit")):
        share = [p[name] / p["wall"] for p in parts]
        print(f"  {label:<30} {C.median([p[name] for p in parts]):6.2f} s, "
              f"share of wall {C.spread([100 * s for s in share], '%', 1)}")


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__)
    p.add_argument("--trials", type=int, help="separate trials of one config (default 8; --quick: 3)")
    p.add_argument("--repetitions", type=int, help="timed repetitions per trial (default 3; --quick: 2)")
    p.add_argument("--budget", help="budget of the tuning run (default 2m; --quick: 15s; 0 skips it)")
    p.add_argument("--space", type=Path, help="search space of the tuning run")
    p.add_argument("--workload", help="workload (default: default; --quick: tiny)")
    a = p.parse_args(argv)
    trials = a.trials or (3 if a.quick else 8)
    reps = a.repetitions or (2 if a.quick else 3)
    budget = parse_duration(a.budget or ("15s" if a.quick else "2m")) if a.budget != "0" else 0
    space = a.space or (C.SPACES_DIR / "quick.yaml" if a.quick else C.default_space())
    workload = get_workload(a.workload or ("tiny" if a.quick else "default"))
    machine = C.Machine.detect()
    config = llama_cpp_defaults(machine.profile.n_cpus, workload.needed_ctx())
    C.header("measurement quality", machine, workload=f"{workload.name} ({workload.prompt_tokens} prompt / "
             f"{workload.generate_tokens} generated tokens), {reps} repetitions per trial",
             config=f"llama-cpp-python defaults: {config_key(config)}")

    outcomes = C.interleave(machine.model, {"defaults": config}, workload, trials, reps)["defaults"]
    ok = [o for o in outcomes if o.ok]
    print(f"repeatability: {len(ok)}/{len(outcomes)} separate trials of one config succeeded")
    for figure in ("prefill_tps", "decode_tps"):
        medians = [C.median(o.result[figure]) for o in ok]
        within = [C.cv(o.result[figure]) for o in ok]
        name = figure.removesuffix("_tps")
        print(f"{name} CV of trial medians: {C.cv(medians):.1%} (trial medians "
              f"{C.spread(medians, ' t/s', 1)}); median within-trial CV {C.median(within):.1%}")
    if ok:
        print_breakdown([breakdown(o.wall_s, o.result) for o in ok])

    if budget:
        C.log(f"tuning for {budget:.0f}s ...")
        run = C.run_tune(budget, space, workload.name, reps, 0, a.cache_dir / "quality-recommendation.yaml")
        done = [r for r in run.records if r.outcome.wall_s]
        in_trials = sum(r.outcome.wall_s for r in done)
        print(f"tuning run: {len(done)} trials in {run.wall_s:.1f}s (budget {budget:.0f}s, space {space.name})")
        print(f"trials per minute of budget: {60 * len(done) / budget:.2f} "
              f"(per minute of wall time {60 * len(done) / run.wall_s:.2f})")
        print(f"share of the run's wall time inside trials: {in_trials / run.wall_s:.1%} "
              f"(outside: {run.wall_s - in_trials:.1f}s of tuner work: profile, bandwidth, sampler, storage, quant)")
        # Only complete trials: a pruned or cut one streamed its figures and has no load / timed split.
        measured = [breakdown(r.outcome.wall_s, r.outcome.result) for r in done
                    if r.outcome.status == R.OK and r.outcome.result]
        if measured:
            print("overhead inside the tuning run's trials:")
            print_breakdown(measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
