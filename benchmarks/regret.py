"""Regret against the exhaustive optimum, in trials and in seconds: multi-fidelity trials and local refinement.

1. Every config of a small, fully enumerable space (``benchmarks/spaces/regret.yaml``: 3 weight
   types x decode threads x prefill threads x micro-batch x flash attention, 48 configs on 2
   CPUs) is measured once, each in its own child process with twice ``--repetitions`` timed
   repetitions (more than a trial runs, so replayed trials draw from more than they use), and cached in
   ``<cache-dir>/regret-v2-<profile id>-<model>-<workload>-r<reps>-<space>.json`` keyed by config,
   so a rerun measures only what is missing. Each entry keeps every repetition's request time
   and the trial's fixed cost (process start, model load, warmup: its wall time minus the timed
   repetitions), so a replay knows what any number of repetitions of it costs in seconds.
2. The objective is ``request_time`` (autotune's default): seconds one request of the workload
   takes. A config's true figure is the median of all its repetitions; the optimum is the
   table's shortest.
3. Searches are replayed against the table with Optuna ask/tell, through the same
   ``ResolvedSpace.suggest``, sampler (``make_sampler``), pruner (``make_pruner``) and adaptive
   rule (``adaptive_rule``, ``protocol.more_repetitions``) as ``tune()``, over ``--seeds`` seeds:
   - ``fixed`` : TPE with a fixed number of repetitions and no pruning (the search before issue 11);
   - ``adaptive`` : repetitions stop once their CV is below 3% (at least 2, at most the ask);
   - ``pruned`` : every repetition is reported (``trial.report``), the median rule stops a loser;
   - ``adaptive+pruned`` : both;
   - ``refined`` : fixed repetitions, and each trial is the incumbent's next untried neighbour
     (``tuner.search.refine.next_neighbour``, queued with ``enqueue_trial``), TPE's sample at a local optimum;
   - ``autotune`` : adaptive + pruned + refined (what ``autotune run`` searches with now);
   - ``random`` and ``grid-shuffled`` : fixed repetitions, for reference.
   A trial's told value is the median of the repetitions it ran; what a search has found after a
   trial is the true figure of the config it would recommend (its best told value among the
   trials not pruned). Seconds are what the trials it ran cost. A repeated config still costs.
   tune()'s baselines, informed starts, composites and re-measurements are not replayed.

Noise: by default every replayed trial draws its repetitions at random (seeded) from its config's
measured ones, so a search meets noise as a real one does and the same config may rank differently
in two trials; ``--frozen`` replays each config's repetitions in their measured order instead (every
trial of a config sees the same figures, and the search is judged on finding the table's best).

Usage: ``python benchmarks/regret.py [--quick] [--seeds 20] [--space FILE] [--frozen]``
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402
import optuna  # noqa: E402
from tuner.search import refine  # noqa: E402
from tuner.backends import protocol  # noqa: E402
from tuner.search.options import make_pruner, make_sampler  # noqa: E402
from tuner.search.stopping import adaptive_rule  # noqa: E402
from optuna.distributions import IntDistribution  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from tuner.backends.settings import TrialSettings, applicable, config_key, normalize  # noqa: E402
from tuner.search.space import ResolvedSpace, load_space  # noqa: E402
from tuner.config.workloads import get_workload  # noqa: E402

THRESHOLDS = (0.10, 0.03)
CHECKPOINTS = (8, 16, 32)
TABLE_VERSION = 2


@dataclass(frozen=True)
class Method:
    """One replayed search: its sampler and which of tune()'s fidelity and proposal steps it uses."""

    name: str
    sampler: str = "tpe"        # "tpe" (tune()'s make_sampler), "random" or "grid" (the table shuffled)
    adaptive: bool = False      # repetitions follow adaptive_rule
    pruned: bool = False        # every repetition reported, make_pruner() stops a loser
    refined: bool = False       # the incumbent's untried neighbours first (tuner.search.refine), TPE at a local optimum


METHODS = (
    Method("fixed"),  # the search before issue 11: fixed repetitions, no pruning
    Method("adaptive", adaptive=True),
    Method("pruned", pruned=True),
    Method("adaptive+pruned", adaptive=True, pruned=True),
    Method("refined", refined=True),
    Method("autotune", adaptive=True, pruned=True, refined=True),  # what `autotune run` searches with now
    Method("random", sampler="random"),
    Method("grid-shuffled", sampler="grid"),
)
GOAL = ("autotune", "fixed")  # the ratio of seconds the goal is about


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
            requests = list(outcome.result["request_s"])
            entry.update(request_s=requests, request=C.median(requests),
                         prefill=C.median(outcome.result["prefill_tps"]),
                         decode=C.median(outcome.result["decode_tps"]),
                         fixed_s=max(outcome.wall_s - sum(requests), 0.0))
        table[config_key(settings)] = entry
        path.write_text(json.dumps(table, indent=1))  # after every config: an interrupted run resumes
        C.log(f"  [{i}/{len(todo)}] {entry.get('request', float('nan')):6.3f} s/request  {_short(settings)}")
    return {config_key(s): table[config_key(s)] for s in configs}, len(todo)


def _short(settings: TrialSettings | dict[str, Any]) -> str:
    s = settings if isinstance(settings, dict) else applicable(settings)
    return (f"{s['quant']} t={s['n_threads']} tb={s['n_threads_batch']} ub={s['n_ubatch']} "
            f"fa={s['flash_attn']} k={s['type_k']}")


@dataclass
class Curve:
    """What a replayed search had found, trial by trial: the true request time of the config it would
    recommend (inf before it has one), and the seconds spent so far."""

    found: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    pruned: int = 0
    repetitions: int = 0


def _draws(entry: dict[str, Any], rng: random.Random | None) -> list[float]:
    """The repetitions one replayed trial of ``entry`` sees: its measured ones in order (frozen noise),
    or as many drawn at random from them (``rng``: every trial of a config sees other noise)."""
    measured = entry["request_s"]
    return list(measured) if rng is None else [rng.choice(measured) for _ in measured]


def _run_trial(entry: dict[str, Any], reps: int, adaptive: bool, trial: optuna.Trial | None,
               rng: random.Random | None = None) -> tuple[float, float, bool, int]:
    """Replay one trial of ``entry``: (told value, seconds it cost, whether it was pruned, repetitions)."""
    protocol.adapt(adaptive_rule(reps) if adaptive else None)
    draws, done = _draws(entry, rng), []
    while protocol.more_repetitions({"request_s": done}, reps) and len(done) < len(draws):
        done.append(draws[len(done)])
        if trial is not None:
            trial.report(statistics.median(done), len(done))
            if trial.should_prune():
                return statistics.median(done), entry["fixed_s"] + sum(done), True, len(done)
    return statistics.median(done), entry["fixed_s"] + sum(done), False, len(done)


def replay(method: Method, seed: int, space: ResolvedSpace, table: dict[str, dict[str, Any]],
           reps: int, n_trials: int, resample: bool = True) -> Curve:
    """Replay ``n_trials`` trials of ``method`` against the table (see the module docstring)."""
    curve, best_told, best_true, spent = Curve(), math.inf, math.inf, 0.0
    rng = random.Random(1_000_003 * seed + 17) if resample else None
    incumbent: dict[str, Any] | None = None  # params of the best told trial (what refinement moves from)
    tried: set[str] = set()
    if method.sampler == "grid":
        keys = list(table)
        random.Random(seed).shuffle(keys)
        study = None
    else:
        sampler = optuna.samplers.RandomSampler(seed=seed) if method.sampler == "random" else make_sampler(seed)
        study = optuna.create_study(direction="minimize", sampler=sampler,
                                    pruner=make_pruner() if method.pruned else optuna.pruners.NopPruner())
    for number in range(min(n_trials, len(table)) if study is None else n_trials):
        if study is not None and method.refined and (step := refine.next_neighbour(space, incumbent, tried)):
            study.enqueue_trial(step[1])
        trial = study.ask() if study else None
        key = keys[number] if study is None else config_key(normalize(space.suggest(trial))[0])
        tried.add(key)
        entry = table[key]
        if entry["status"] != "ok":
            spent += entry["wall_s"]
            if study:
                study.tell(trial, state=TrialState.FAIL)
        else:
            told, cost, pruned, ran = _run_trial(entry, reps, method.adaptive, trial if method.pruned else None, rng)
            spent += cost
            curve.repetitions += ran
            if study:
                study.tell(trial, state=TrialState.PRUNED) if pruned else study.tell(trial, told)
            curve.pruned += pruned
            if not pruned and told < best_told:
                best_told, best_true = told, entry["request"]
                incumbent = dict(trial.params) if trial else None
        curve.found.append(best_true)
        curve.seconds.append(spent)
    protocol.adapt(None)
    return curve


def first_within(curve: Curve, target: float) -> tuple[int, float] | None:
    """(1-based trial, seconds spent) when the search first had a config of true figure <= ``target``."""
    return next(((i, s) for i, (f, s) in enumerate(zip(curve.found, curve.seconds), 1) if f <= target), None)


def report(method: str, curves: list[Curve], best: float) -> dict[float, list[float]]:
    """Print trials and seconds to each threshold over the seeds; the seconds per threshold."""
    n_trials = len(curves[0].found)
    seconds_by: dict[float, list[float]] = {}
    for thr in THRESHOLDS:
        hits = [first_within(c, (1 + thr) * best) for c in curves]
        # A seed that never gets there counts as one trial more than it ran, and all its seconds.
        trials = [float(h[0]) if h else n_trials + 1.0 for h in hits]
        seconds = [h[1] if h else c.seconds[-1] for h, c in zip(hits, curves)]
        seconds_by[thr] = seconds
        print(f"{method:<16} within {thr:.0%}: {C.spread(trials, ' trials', 1)}; {C.spread(seconds, ' s', 0)}; "
              f"reached by {sum(h is not None for h in hits)}/{len(hits)} seeds within {n_trials} trials")
    ks = [k for k in CHECKPOINTS if k <= n_trials]
    regrets = [f"{C.median([c.found[k - 1] / best - 1 for c in curves]):.1%}" for k in ks]
    per_trial = C.median([c.seconds[-1] / len(c.seconds) for c in curves])
    reps = C.median([c.repetitions / len(c.seconds) for c in curves])
    regret_text = f"median regret after {' / '.join(map(str, ks))} trials: {' / '.join(regrets)}; " if ks else ""
    print(f"{method:<16} {regret_text}{per_trial:.1f} s and {reps:.1f} repetitions per trial; "
          f"{C.median([c.pruned for c in curves]):.0f} pruned")
    return seconds_by


def verify(machine: C.Machine, top: list[dict[str, Any]], workload: Any, reps: int) -> None:
    """Re-measure the table's top configs side by side: is the table's best still the best?"""
    configs = {_short(e["settings"]): TrialSettings(**e["settings"]) for e in top}
    out = C.interleave(machine.model, configs, workload, 2, reps)
    print(f"re-measured top {len(top)} (2 alternating rounds each; the table's measurement in brackets):")
    for entry, (name, outcomes) in zip(top, out.items()):
        print(f"  {name}: request {C.spread(C.samples(outcomes, 'request_s'), ' s', 3)} [{entry['request']:.3f} s]")


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__)
    p.add_argument("--space", type=Path,
                   help="enumerable space (default spaces/regret.yaml; --quick: regret-quick.yaml)")
    p.add_argument("--workload", help="workload (default: the space's 'short'; --quick: tiny)")
    p.add_argument("--repetitions", type=int, help="repetitions a trial asks for (default 3; --quick: 2); "
                   "the table measures twice as many")
    p.add_argument("--seeds", type=int, help="seeds per search (default 20; --quick: 3)")
    p.add_argument("--frozen", action="store_true",
                   help="replay each config's measured repetitions in order (default: draw them at random)")
    p.add_argument("--verify-top", type=int, default=None,
                   help="re-measure the table's top K configs in 2 alternating rounds (default 3; --quick: 0)")
    a = p.parse_args(argv)
    path = a.space or C.SPACES_DIR / ("regret-quick.yaml" if a.quick else
                                      "regret.yaml" if C.variants_ready() else "regret-noquant.yaml")
    space_file = load_space(path)
    workload = get_workload(a.workload or ("tiny" if a.quick else "short"), space_file.workloads, str(path))
    reps = a.repetitions or (2 if a.quick else 3)
    seeds = a.seeds or (3 if a.quick else 20)
    a.verify_top = (0 if a.quick else 3) if a.verify_top is None else a.verify_top
    machine = C.Machine.detect()
    space = space_file.resolve(machine.profile.n_cpus, workload.needed_ctx(), prefill_tokens=workload.prefill_tokens())
    configs = enumerate_space(space)
    measured_reps = 2 * reps
    C.header("regret against the exhaustive optimum", machine, search_space=f"{path} ({len(configs)} configs)",
             workload=f"{workload.name} ({workload.prompt_tokens} prompt / {workload.generate_tokens} "
             f"generated tokens); trials ask for {reps} repetitions, the table has {measured_reps} per config",
             seeds=seeds)
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    cache = a.cache_dir / (f"regret-v{TABLE_VERSION}-{machine.profile.id}-{machine.model.short_id}-"
                           f"{workload.name}-r{measured_reps}-{space.hash}.json")
    table, measured = build_table(machine, configs, workload, measured_reps, cache)
    ok = {k: v for k, v in table.items() if v["status"] == "ok"}
    if not ok:
        print("no config ran: nothing to compare")
        return 1
    ranked = sorted(ok.values(), key=lambda v: v["request"])
    best = ranked[0]["request"]
    print(f"table: {len(table)} configs ({measured} measured now, {len(table) - measured} from {cache}), "
          f"{len(table) - len(ok)} failed")
    print("objective: request_time (seconds per request, lower is better); one cached measurement per "
          "config; " + ("noise is frozen in the replay (repetitions in their measured order)" if a.frozen else
                        "each replayed trial draws its repetitions at random from its config's measured ones"))
    print(f"true best: {best:.3f} s per request (prefill {ranked[0]['prefill']:.1f}, decode "
          f"{ranked[0]['decode']:.1f} t/s): {_short(ranked[0]['settings'])}")
    print(f"worst: {ranked[-1]['request']:.3f} s; median config: {C.median([v['request'] for v in ranked]):.3f} s; "
          f"configs within 3% of the best: {sum(v['request'] <= 1.03 * best for v in ranked)}, "
          f"within 10%: {sum(v['request'] <= 1.1 * best for v in ranked)}; a full trial costs "
          f"{C.spread([v['fixed_s'] + sum(v['request_s'][:reps]) for v in ranked], ' s', 1)}")
    if a.verify_top and len(ranked) > 1:
        verify(machine, ranked[:a.verify_top], workload, reps)
    n_trials = max(2 * len(table), 16)
    seconds: dict[str, dict[float, list[float]]] = {}
    for method in METHODS:
        curves = [replay(method, seed, space, table, reps, n_trials, resample=not a.frozen) for seed in range(seeds)]
        seconds[method.name] = report(method.name, curves, best)
    now, before = GOAL
    for thr in THRESHOLDS:
        base = C.median(seconds[before][thr])
        ratios = [s / base for s in seconds[now][thr]] if base > 0 else []
        print(f"seconds to within {thr:.0%}, {now} / {before} (median of each over seeds): "
              f"{C.median(seconds[now][thr]) / base:.2f}x; per seed against the {before} median: "
              f"{C.spread(ratios, 'x', 2)} (goal: 0.50x or less within 3%)")
    return 0


if __name__ == "__main__":
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sys.exit(main())
