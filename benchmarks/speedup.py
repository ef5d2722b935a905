"""Speedup over defaults: what `autotune run` finds vs llama-cpp-python's own defaults, re-measured.

1. ``tune()`` searches the llama.cpp space for ``--budget`` (default 5m) into a fresh study
   and writes its recommendation (kept as ``<cache-dir>/speedup-recommendation.yaml``, which
   ``roofline.py`` reads).
2. The defaults (what ``Llama(model_path)`` runs: n_threads = CPUs/2, n_threads_batch = CPUs,
   n_batch = n_ubatch = 512, no flash attention, f16 KV cache, the shipped weights, n_ctx
   raised to fit the workload) and the recommended config are then measured again, back to
   back, in alternating order (A B, B A, ...), ``--rounds`` trials each, every trial in its
   own process with ``--repetitions`` timed repetitions.
3. Each round gives one paired ratio recommended/defaults of the trial medians; the speedup
   is the median of those ratios with its IQR and min-max.

The tuner's own claim (its search-time figures, in the recommendation's ``speedup``) is printed
next to it: the re-measured ratio is the honest one, since the search keeps the luckiest config.

Usage: ``python benchmarks/speedup.py [--quick] [--budget 5m] [--rounds 6]``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402

from tuner.backends.llama_cpp.backend import LlamaCpp  # noqa: E402
from tuner.backends import DEFAULT as DEFAULT_BACKEND  # noqa: E402
from tuner.recommend.document import load as load_recommendation  # noqa: E402
from tuner.backends.llama_cpp.backend import llama_cpp_defaults  # noqa: E402
from tuner.backends.settings import TrialSettings, config_key, normalize  # noqa: E402
from tuner.util.units import parse_duration  # noqa: E402
from tuner.config.workloads import get_workload  # noqa: E402

RECOMMENDATION_FILE = "speedup-recommendation.yaml"


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__)
    p.add_argument("--budget", help="tuning budget (default 5m; --quick: 15s)")
    p.add_argument("--space", type=Path, help="search space (default: the llama.cpp space)")
    p.add_argument("--rounds", type=int, help="paired re-measurements (default 6; --quick: 2)")
    p.add_argument("--repetitions", type=int, help="timed repetitions per trial (default 3; --quick: 1)")
    p.add_argument("--workload", help="workload name (default: default; --quick: tiny)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--recommendation", type=Path, help="skip tuning: compare this recommendation file")
    a = p.parse_args(argv)
    budget = parse_duration(a.budget or ("15s" if a.quick else "5m"))
    space = a.space or (C.SPACES_DIR / "quick.yaml" if a.quick else C.default_space())
    rounds = a.rounds or (2 if a.quick else 6)
    reps = a.repetitions or (1 if a.quick else 3)
    workload = get_workload(a.workload or ("tiny" if a.quick else "default"))
    machine = C.Machine.detect()
    C.header("speedup over llama-cpp-python defaults", machine, workload=f"{workload.name} "
             f"({workload.prompt_tokens} prompt / {workload.generate_tokens} generated tokens)",
             search_space=space, quality_gate=C.quality_gate() or "off (tuner.backends.llama_cpp.quant cannot measure perplexity yet)",
             tuning_budget=f"{budget:.0f}s" if not a.recommendation else "none (given file)",
             re_measurement=f"{rounds} alternating rounds x 2 configs, {reps} repetitions per trial")

    a.cache_dir.mkdir(parents=True, exist_ok=True)
    if a.recommendation:
        rec_path = a.recommendation
    else:
        rec_path = a.cache_dir / RECOMMENDATION_FILE
        C.log(f"tuning for {budget:.0f}s ...")
        run = C.run_tune(budget, space, workload.name, reps, a.seed, rec_path)
        print(f"tuning: {run.result.trials_run} trials in {run.wall_s:.1f}s (budget {budget:.0f}s), "
              f"study {run.result.study_name}")
    doc = load_recommendation(rec_path)
    if doc["settings"].get("backend", DEFAULT_BACKEND) != LlamaCpp.name:
        print(f"the recommendation uses the {doc['settings']['backend']} backend: this benchmark compares "
              "llama.cpp configs only")
        return 1
    recommended, _ = normalize(TrialSettings(**doc["settings"]))
    defaults = llama_cpp_defaults(machine.profile.n_cpus, workload.needed_ctx())
    print(f"defaults:    {config_key(defaults)}")
    print(f"recommended: {config_key(recommended)}")
    if config_key(recommended) == config_key(defaults):
        print("the recommendation is the defaults config: the speedup is 1 by construction")
    claimed = doc.get("speedup")

    out = C.interleave(machine.model, {"defaults": defaults, "recommended": recommended}, workload,
                       rounds, reps)
    for name, outcomes in out.items():
        print(f"{name:<12} prefill {C.spread(C.samples(outcomes, 'prefill_tps'), ' t/s', 1)}; "
              f"decode {C.spread(C.samples(outcomes, 'decode_tps'), ' t/s', 1)}")
    for figure in ("prefill", "decode"):
        ratios = C.paired_ratios(out["defaults"], out["recommended"], f"{figure}_tps")
        print(f"{figure} speedup: {C.spread(ratios, 'x')} [median of per-round ratios]")
    if claimed:
        print(f"tuner's own claim (search-time figures): prefill {claimed['prefill']:.2f}x, "
              f"decode {claimed['decode']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
