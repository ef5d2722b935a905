"""Regret against the exhaustive optimum: how many trials the tuner's sampler needs to find the best.

1. Every config of a small, fully enumerable space (``benchmarks/spaces/regret.yaml``: 3 weight
   types x decode threads x prefill threads x micro-batch x flash attention, 48 configs on 2
   CPUs) is measured once, each in its own child process with ``--repetitions`` timed
   repetitions, and cached in ``<cache-dir>/regret-<profile id>-<model>-<workload>-r<reps>.json``
   keyed by config, so a rerun measures only what is missing.
2. The objective is the balanced figure of ``select.Candidate.balanced``: the geometric mean of
   prefill and decode tokens/s (the figure a default ``autotune run`` ranks its Pareto front by).
   The true best is the table's best.
3. Samplers are replayed against the table with Optuna ask/tell, through the same
   ``ResolvedSpace.suggest`` as ``tune()``: TPE with tune()'s arguments (multivariate, group,
   8 startup trials) on tune()'s default two objectives (prefill, decode) and on the balanced
   figure alone, random search, and the grid (in file order, and shuffled without repeats),
   each over ``--seeds`` seeds. A trial that repeats an already-seen config still counts: it
   costs a trial in a real run. tune()'s baseline trial and re-measurements are not replayed.

The replay uses one cached measurement per config, so its noise is frozen: the figures say
how fast each sampler finds the table's best, not how robust it is to measurement noise
(``quality.py`` measures that noise; ``tune()`` re-measures its top configs for that reason).

Usage: ``python benchmarks/regret.py [--quick] [--seeds 20] [--space FILE]``
"""

from __future__ import annotations

import itertools
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402
import optuna  # noqa: E402
from tuner.search import make_sampler  # noqa: E402
from optuna.distributions import IntDistribution  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from tuner.settings import TrialSettings, applicable, config_key, normalize  # noqa: E402
from tuner.space import ResolvedSpace, load_space  # noqa: E402
from tuner.workloads import get_workload  # noqa: E402

THRESHOLDS = (0.10, 0.03)
CHECKPOINTS = (8, 16, 32)
METHODS = ("tpe-pareto", "tpe-balanced", "random", "grid-shuffled", "grid-file-order")


def enumerate_space(space: ResolvedSpace) -> list[TrialSettings]:
    """Every real config of ``space`` (after llama.cpp's clamping), in file order, without repeats."""
    names = list(space.distributions)
    values = [list(range(d.low, d.high + 1, d.step)) if isinstance(d, IntDistribution) else list(d.choices)
              for d in space.distributions.values()]
    seen: dict[str, TrialSettings] = {}
    for combo in itertools.product(*values):
        base = space.defaults(space.backends[0]).model_dump()
        settings, _ = normalize(TrialSettings(**{**base, **dict(zip(names, combo))}))
        seen.setdefault(config_key(settings), settings)
    return list(seen.values())


def build_table(machine: C.Machine, configs: list[TrialSettings], workload: Any, reps: int,
                path: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """The measured table (config key -> figures), measuring only configs missing from ``path``."""
    table = json.loads(path.read_text()) if path.is_file() else {}
    todo = [s for s in configs if config_key(s) not in table]
    for i, settings in enumerate(todo, 1):
        outcome = C.measure(machine.model, settings, workload, reps)
        entry: dict[str, Any] = {"settings": applicable(settings), "status": outcome.status,
                                 "reason": outcome.reason, "wall_s": outcome.wall_s}
        if outcome.ok:
            prefill, decode = C.median(outcome.result["prefill_tps"]), C.median(outcome.result["decode_tps"])
            entry.update(prefill=prefill, decode=decode, balanced=math.sqrt(prefill * decode))
        table[config_key(settings)] = entry
        path.write_text(json.dumps(table, indent=1))  # after every config: an interrupted run resumes
        C.log(f"  [{i}/{len(todo)}] {entry.get('balanced', 0):7.1f} balanced  {_short(settings)}")
    return {config_key(s): table[config_key(s)] for s in configs}, len(todo)


def _short(settings: TrialSettings | dict[str, Any]) -> str:
    s = settings if isinstance(settings, dict) else applicable(settings)
    return (f"{s['quant']} t={s['n_threads']} tb={s['n_threads_batch']} ub={s['n_ubatch']} "
            f"fa={s['flash_attn']} k={s['type_k']}")


def replay(method: str, seed: int, space: ResolvedSpace, table: dict[str, dict[str, Any]],
           order: list[str], n_trials: int) -> list[float]:
    """Best balanced figure found after each of ``n_trials`` trials of ``method``."""
    if method.startswith("grid"):
        keys = list(order)
        if method == "grid-shuffled":
            random.Random(seed).shuffle(keys)
        picks = iter(keys[:n_trials])
    else:
        directions = ["maximize", "maximize"] if method == "tpe-pareto" else ["maximize"]
        sampler = optuna.samplers.RandomSampler(seed=seed) if method == "random" else \
            make_sampler(seed)
        study = optuna.create_study(directions=directions, sampler=sampler)
        picks = _ask_tell(study, space, table, n_trials, pareto=method == "tpe-pareto")
    best, curve = 0.0, []
    for key in picks:
        best = max(best, table[key].get("balanced", 0.0))
        curve.append(best)
    return curve


def _ask_tell(study: optuna.Study, space: ResolvedSpace, table: dict[str, dict[str, Any]], n_trials: int,
              pareto: bool):
    for _ in range(n_trials):
        trial = study.ask()
        key = config_key(normalize(space.suggest(trial))[0])
        entry = table[key]
        if entry["status"] != "ok":
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, [entry["prefill"], entry["decode"]] if pareto else entry["balanced"])
        yield key


def trials_to(curve: list[float], target: float) -> int | None:
    """1-based number of the first trial whose best-so-far reaches ``target``, or None."""
    return next((i for i, value in enumerate(curve, 1) if value >= target), None)


def report(method: str, curves: list[list[float]], best: float, cap: int) -> None:
    """Print trials-to-threshold and regret-at-checkpoint figures of one sampler over its seeds."""
    n_trials = len(curves[0])  # a grid ends when it is exhausted
    for thr in THRESHOLDS:
        hits = [trials_to(c, (1 - thr) * best) for c in curves]
        reached = [h for h in hits if h is not None]
        # Seeds that never get there count as n_trials + 1 so the median stays honest.
        figures = [float(h if h is not None else n_trials + 1) for h in hits]
        print(f"{method:<16} within {thr:.0%}: {C.spread(figures, ' trials', 1)}; "
              f"reached by {len(reached)}/{len(hits)} seeds within {n_trials} trials")
    ks = [k for k in CHECKPOINTS if k <= cap]
    regrets = [f"{C.median([1 - c[min(k, len(c)) - 1] / best for c in curves]):.1%}" for k in ks]
    print(f"{method:<16} median regret after {' / '.join(map(str, ks))} trials: {' / '.join(regrets)}")


def verify(machine: C.Machine, top: list[dict[str, Any]], workload: Any, reps: int) -> None:
    """Re-measure the table's top configs side by side: is the table's best still the best?"""
    configs = {_short(e["settings"]): TrialSettings(**e["settings"]) for e in top}
    out = C.interleave(machine.model, configs, workload, 2, reps)
    print(f"re-measured top {len(top)} (2 alternating rounds each; the table's single measurement in brackets):")
    for entry, (name, outcomes) in zip(top, out.items()):
        prefill, decode = C.samples(outcomes, "prefill_tps"), C.samples(outcomes, "decode_tps")
        print(f"  {name}: balanced {math.sqrt(C.median(prefill) * C.median(decode)):.1f} "
              f"[{entry['balanced']:.1f}], prefill {C.spread(prefill, '', 1)}, decode {C.spread(decode, '', 1)}")


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__)
    p.add_argument("--space", type=Path,
                   help="enumerable space (default spaces/regret.yaml; --quick: regret-quick.yaml)")
    p.add_argument("--workload", help="workload (default: the space's 'short'; --quick: tiny)")
    p.add_argument("--repetitions", type=int, help="timed repetitions per config (default 3; --quick: 1)")
    p.add_argument("--seeds", type=int, help="seeds per sampler (default 20; --quick: 3)")
    p.add_argument("--verify-top", type=int, default=None,
                   help="re-measure the table's top K configs in 2 alternating rounds (default 3; --quick: 0)")
    a = p.parse_args(argv)
    path = a.space or C.SPACES_DIR / ("regret-quick.yaml" if a.quick else
                                      "regret.yaml" if C.variants_ready() else "regret-noquant.yaml")
    space_file = load_space(path)
    workload = get_workload(a.workload or ("tiny" if a.quick else "short"), space_file.workloads, str(path))
    reps = a.repetitions or (1 if a.quick else 3)
    seeds = a.seeds or (3 if a.quick else 20)
    a.verify_top = (0 if a.quick else 3) if a.verify_top is None else a.verify_top
    machine = C.Machine.detect()
    space = space_file.resolve(machine.profile.n_cpus, workload.needed_ctx(), prefill_tokens=workload.prefill_tokens())
    configs = enumerate_space(space)
    C.header("regret against the exhaustive optimum", machine, search_space=f"{path} ({len(configs)} configs)",
             workload=f"{workload.name} ({workload.prompt_tokens} prompt / {workload.generate_tokens} "
             f"generated tokens), {reps} repetitions per config", seeds=seeds)
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    cache = a.cache_dir / (f"regret-{machine.profile.id}-{machine.model.short_id}-{workload.name}-r{reps}-"
                           f"{space.hash}.json")
    table, measured = build_table(machine, configs, workload, reps, cache)
    ok = {k: v for k, v in table.items() if v["status"] == "ok"}
    if not ok:
        print("no config ran: nothing to compare")
        return 1
    best_key = max(ok, key=lambda k: ok[k]["balanced"])
    best = ok[best_key]["balanced"]
    ranked = sorted(ok.values(), key=lambda v: -v["balanced"])
    print(f"table: {len(table)} configs ({measured} measured now, {len(table) - measured} from {cache}), "
          f"{len(table) - len(ok)} failed")
    print("objective: balanced = sqrt(prefill x decode) tokens/s; one cached measurement per config "
          "(noise is frozen in the replay)")
    print(f"true best: {best:.1f} balanced (prefill {ok[best_key]['prefill']:.1f}, decode "
          f"{ok[best_key]['decode']:.1f} t/s): {_short(ok[best_key]['settings'])}")
    print(f"worst: {ranked[-1]['balanced']:.1f}; median config: {C.median([v['balanced'] for v in ranked]):.1f}; "
          f"configs within 3% of the best: {sum(v['balanced'] >= 0.97 * best for v in ranked)}, "
          f"within 10%: {sum(v['balanced'] >= 0.9 * best for v in ranked)}")
    if a.verify_top and len(ranked) > 1:
        verify(machine, ranked[:a.verify_top], workload, reps)
    n_trials = max(2 * len(table), 16)
    order = list(table)
    for method in METHODS:
        curves = [replay(method, seed, space, table, order, n_trials)
                  for seed in (range(1) if method == "grid-file-order" else range(seeds))]
        report(method, curves, best, n_trials)
    return 0


if __name__ == "__main__":
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sys.exit(main())
