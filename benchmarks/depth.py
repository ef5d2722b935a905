"""Decode right after the prompt against decode at depth: which config each figure picks for the
``long-prompt`` workload, and how long a request then takes, re-measured side by side (issue 29).

1. ``tune()`` searches ``--space`` for ``--budget`` into a fresh study with the ``long-prompt`` workload;
   every trial measures decode right after the prompt and decode with the cache at depth (``--depth``:
   the workload's end by default, or N tokens / a share of n_ctx such as 75%).
2. From the same pooled configs two picks are taken: the fastest request counted with the decode figure
   right after the prompt (time to first token + answer / that rate), and the fastest counted with the
   decode figure at depth.
3. Both are measured again in alternating order, ``--rounds`` trials each; for each pick the request
   time with either decode figure, and the per-round ratio after-prompt pick / depth pick of the request
   time at depth (the one that workload ranks by).

Usage: ``python benchmarks/depth.py [--quick] [--budget 5m] [--depth 75%] [--rounds 3]``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402

from tuner.backends.settings import TrialSettings  # noqa: E402
from tuner.util.units import parse_duration  # noqa: E402
from tuner.config.workloads import get_workload, with_depth  # noqa: E402

PICKS = {"after-prompt pick": "decode", "depth pick": "decode_depth"}


def request_with(cand, figure: str, n_generate: int) -> float:
    """Seconds of one request of the pooled ``cand`` with its ``figure`` ('decode' or 'decode_depth')."""
    stat = getattr(cand, figure)
    return cand.ttft.median + n_generate / stat.median if stat and cand.ttft and stat.median > 0 else float("inf")


def per_repetition(outcome, key: str) -> list[float]:
    """Request seconds per repetition of a re-measure, with decode taken from ``key`` samples."""
    r = outcome.result
    return [t + r["generate_tokens"] / d for t, d in zip(r["ttft_s"], r[key]) if d > 0]


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__)
    p.add_argument("--budget", help="tuning budget (default 5m; --quick: 25s)")
    p.add_argument("--space", type=Path, help="search space (default: the shipped llama.cpp space)")
    p.add_argument("--depth", help="decode-at-depth: N tokens or a share of n_ctx (default: the workload's end)")
    p.add_argument("--rounds", type=int, help="paired re-measurements (default 3; --quick: 1)")
    p.add_argument("--repetitions", type=int, help="timed repetitions per trial (default 3; --quick: 1)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    budget = parse_duration(a.budget or ("25s" if a.quick else "5m"))
    space = a.space or (C.SPACES_DIR / "depth-quick.yaml" if a.quick else C.default_space())
    rounds, reps = a.rounds or (1 if a.quick else 3), a.repetitions or (1 if a.quick else 3)
    name = "long-prompt-quick" if a.quick else "long-prompt"
    from tuner.search.space import load_space

    workload = with_depth(get_workload(name, load_space(str(space)).workloads), a.depth)
    machine = C.Machine.detect()
    C.header("decode after the prompt against decode at depth: the request time of each figure's pick", machine,
             workload=f"{workload.name} ({workload.prompt_tokens} prompt / {workload.generate_tokens} generated, "
                      f"depth {workload.depth or 'where it ends'})",
             search_space=space, tuning_budget=f"{budget:.0f}s",
             re_measurement=f"{rounds} alternating rounds x 2 configs, {reps} repetitions per trial")
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    run = C.run_tune(budget, space, name, reps, a.seed, a.cache_dir / "depth-recommendation.yaml", depth=a.depth)
    cands = [c for c in run.candidates if c.decode_depth is not None and c.ttft is not None]
    print(f"tuning: {run.result.trials_run} trials in {run.wall_s:.1f}s, {len(cands)} measured configs")
    if not cands:
        print("no config measured decode at depth: give a larger --budget")
        return 1
    picks = {label: min(cands, key=lambda c, f=figure: request_with(c, f, workload.generate_tokens))
             for label, figure in PICKS.items()}
    for label, cand in picks.items():
        print(f"{label:<18} {cand.config_key} (search: decode {cand.decode.median:.1f} t/s after the prompt, "
              f"{cand.decode_depth.median:.1f} t/s at depth)")
    if picks["after-prompt pick"].config_key == picks["depth pick"].config_key:
        print("both figures pick the same config here: the ratio is 1 by construction")
    configs = {label: TrialSettings(**cand.settings) for label, cand in picks.items()}
    out = C.interleave(machine.model, configs, workload, rounds, reps)
    for label, outcomes in out.items():
        ok = [o for o in outcomes if o.ok]
        after = [v for o in ok for v in per_repetition(o, "decode_tps")]
        deep = [v for o in ok for v in per_repetition(o, "decode_depth_tps")]
        depth = ok[0].result.get("depth") if ok else "-"
        print(f"{label:<18} request at depth {C.spread(deep, ' s', 2)}; after the prompt "
              f"{C.spread(after, ' s', 2)}; depth {depth} tokens")
    ratios = [C.median(per_repetition(x, "decode_depth_tps")) / C.median(per_repetition(y, "decode_depth_tps"))
              for x, y in zip(out["after-prompt pick"], out["depth pick"]) if x.ok and y.ok]
    print(f"request time at depth, after-prompt pick / depth pick: {C.spread(ratios, 'x')} [per-round ratios]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
