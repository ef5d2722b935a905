"""Against the exhaustive optimum: how close `autotune run --budget 2m` and `--budget 10m` get to the
best config of an exhaustive grid, and how many seconds they need to come within 3% of it.

1. Every config of ``benchmarks/spaces/grid.yaml`` (weight types that pass the 5% quality guard x
   decode threads x batch threads x flash attention; 32 configs on 2 CPUs) is measured with
   autotune's own measurement (one child process per config, ``--repetitions`` repetitions, the
   default workload). The grid optimum is the config with the shortest request time.
2. ``tune()`` runs on autotune's default space (what `autotune run` searches) for each budget
   and seed, each into a fresh study. Per run: trials, elapsed time against the budget (the budget
   promise: budget + max(10%, 30 s)), the seconds until a trial came within 3% of the grid
   optimum's request time, and the recommendation.
3. The grid's three best configs and every recommendation are measured again, interleaved
   (``--rounds`` rounds, the order alternating), and each recommendation's prefill, decode and
   request time are given as ratios to the re-measured grid optimum of the same rounds, median
   over rounds, then median and spread over seeds. Goal: the request speed >= 0.90 (2m) and >= 0.97
   (10m) of the grid optimum's in every seed (and, as before, on prefill and decode at once).
4. When the grid's re-measured best configs tie on request time (autotune's own rule,
   :func:`tuner.selection.decision.compare`: not significantly different, the whole interval of the shift within
   3%), each is an optimum, and
   they may trade prefill for decode (flash attention does on this model). The goal is then also
   counted against each tied optimum: a seed meets it if it reaches the goal against one of them.
5. Per run: how many confirmation-stage trials were cut at the deadline (the goal is none), and how
   many repetitions were disturbed by other processes.

``--busy`` tunes and judges under a steady load instead (:mod:`busy`: the pick against llama.cpp's defaults,
both under the load; no grid).

``--model PATH`` runs all of it on another GGUF file (a made model of benchmarks/models.py, issue 44: the
grid at the scale users run) and ``--quants`` fixes the weight types the grid compares (default with
``--model``: Q8_0, Q6_K, Q4_K_M, Q4_0, F16; the source's own type is measured as the source file): on random
weights no quality guard may choose them, and a made model's speed-only mark turns the tuning runs' guard off
(autotune reads ``autotune.speed_only``). ``--workload`` picks another workload (e.g. long-prompt).

``--noise`` runs a bounded background CPU load (:class:`common.Noise`: one CPU busy 2-8 s at random
intervals) during the tuning runs only, never during the grid or the re-measurement that judges them.

Usage: ``python benchmarks/grid.py [--quick] [--noise | --both | --busy] [--budgets 2m,10m] [--seeds 3] [--rounds 3]
[--model PATH] [--quants Q8_0,Q6_K,Q4_K_M,Q4_0,F16] [--workload NAME]``
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import busy  # noqa: E402
import common as C  # noqa: E402
import quality  # noqa: E402
import regret  # noqa: E402

from tuner.cli.render import short_settings  # noqa: E402
from tuner.measure import disturbance  # noqa: E402
from tuner.selection import decision  # noqa: E402
from tuner.measure import records as R  # noqa: E402
from tuner.search.options import grace_s  # noqa: E402
from tuner.backends.settings import TrialSettings, config_key  # noqa: E402
from tuner.search.space import DEFAULT_SPACE, load_space  # noqa: E402
from tuner.util.units import parse_duration  # noqa: E402
from tuner.config.workloads import get_workload  # noqa: E402
from tuner.util.yamlio import read_yaml, write_yaml  # noqa: E402

WITHIN = 0.03
MODEL_QUANTS = "Q8_0,Q6_K,Q4_K_M,Q4_0,F16"  # issue 44: the weight types of the grid on a given model
FIGURES = {"prefill": "prefill_tps", "decode": "decode_tps", "request": "request_s"}


def measure_grid(machine: C.Machine, space_path: Path, workload: Any, reps: int, screen: int | None = None,
                 cache_dir: Path | None = None, reuse: bool = False) -> list[dict[str, Any]]:
    """Every config of the grid measured: [{settings, key, prefill, decode, request, status, wall_s}].

    With ``screen`` (issue 44: a grid of a 1.5B model at ``reps`` repetitions takes hours), every config is
    first measured with one repetition and only the ``screen`` fastest are measured again with ``reps``; their
    full figures replace the screening ones (the others keep theirs, marked ``screened``). The table is kept in
    ``cache_dir`` keyed by machine profile, model, grid, workload, repetitions and screen; with ``reuse`` a kept
    table is read instead of measuring (a rerun, or one restarted after a kill: its rows say ``kept``)."""
    space = load_space(space_path).resolve(machine.profile.n_cpus, workload.needed_ctx(), prefill_tokens=workload.prefill_tokens())
    configs = list(regret.enumerate_space(space))
    cache = None
    if cache_dir is not None:
        ident = hashlib.sha256(repr((workload.model_dump(), reps, screen,
                                     [config_key(c) for c in configs])).encode()).hexdigest()[:12]
        cache = cache_dir / f"grid-table-{machine.profile.id}-{machine.model.short_id}-{ident}.json"
        if reuse and cache.is_file():
            rows = json.loads(cache.read_text())
            C.log(f"  grid: {len(rows)} configs from {cache}")
            return [{**row, "settings": TrialSettings(**row["settings"]), "kept": str(cache)} for row in rows]
    rows = [_grid_row(machine, settings, workload, 1 if screen else reps, f"{i}/{len(configs)}")
            for i, settings in enumerate(configs, 1)]
    if screen:
        for row in sorted((r for r in rows if "request" in r), key=lambda r: r["request"])[:screen]:
            full = _grid_row(machine, row["settings"], workload, reps, "full")
            row.update({k: v for k, v in full.items() if k != "settings"}, wall_s=row["wall_s"] + full["wall_s"])
        for row in rows:
            row["screened"] = row["reps"] == 1 and reps > 1
    if cache is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps([{**r, "settings": r["settings"].model_dump()} for r in rows], indent=1))
    return rows


def _grid_row(machine: C.Machine, settings: TrialSettings, workload: Any, reps: int, label: str) -> dict[str, Any]:
    """One grid config measured in its own child: its key, status, wall time and median figures."""
    out = C.measure(machine.model, settings, workload, reps)
    row = {"settings": settings, "key": config_key(settings), "status": out.status, "wall_s": out.wall_s, "reps": reps}
    if out.ok:
        row.update({name: C.median(out.result[field]) for name, field in FIGURES.items()})
    C.log(f"  grid {label}: {row['key']} {row.get('request', out.reason)}")
    return row


def with_quants(grid: Path, quants: list[str], source_type: str, out_dir: Path) -> Path:
    """The grid ``grid`` with its weight types fixed to ``quants`` (the source's own file type as ``source``,
    so it is not copied into a variant of itself), written once to ``out_dir``; its other dimensions as they are."""
    names = list(dict.fromkeys("source" if q.upper() == source_type.upper() else q for q in quants))
    doc = read_yaml(grid, "grid space")
    doc["params"] = {"quant": {"choices": names}, **{k: v for k, v in doc["params"].items() if k != "quant"}}
    doc["description"] = f"{doc.get('description', 'grid')}, weight types {', '.join(names)}"
    path = out_dir / f"{grid.stem}-{hashlib.sha256(repr(doc).encode()).hexdigest()[:10]}.yaml"
    if not path.is_file():
        out_dir.mkdir(parents=True, exist_ok=True)
        write_yaml(path, doc)
    return path


def _ratios(rec: list[Any], opt: list[Any], figure: str) -> list[float]:
    pairs = C.paired_ratios(opt, rec, FIGURES[figure])
    return [1 / r for r in pairs] if figure == "request" else pairs  # request: shorter is better


def _meets(rec: list[Any], opt: list[Any], goal: float) -> bool:
    """Whether the median round's ratio of ``rec`` to ``opt`` reaches ``goal`` on prefill and decode."""
    ratios = [_ratios(rec, opt, figure) for figure in ("prefill", "decode")]
    return all(ratios) and min(C.median(r) for r in ratios) >= goal


def tied_optima(out: dict[str, list[Any]], names: list[str]) -> list[str]:
    """Of the re-measured configs ``names``, the one with the shortest median request time and those
    tied with it by autotune's decision rule (:func:`tuner.selection.decision.compare`), shortest first."""
    req = {n: R.Stat.of(C.samples(out[n], "request_s")) for n in names if C.samples(out[n], "request_s")}
    if not req:
        return []
    ranked = sorted(req, key=lambda n: req[n].median)

    class Figures:  # what the decision rule reads of a measured config
        def __init__(self, stat: R.Stat) -> None:
            self.request, self.prefill, self.decode = stat, None, None

    top = Figures(req[ranked[0]])
    return [n for n in ranked if n == ranked[0]
            or decision.compare(Figures(req[n]), top, "request_time").verdict == decision.TIED]


def cut_confirmations(run: C.TuneRun) -> int:
    """Confirmation-stage trials of ``run`` that were cut at the deadline."""
    return sum(1 for r in run.records if r.role == "remeasure" and r.outcome.status == R.CUT)


def disturbed(run: C.TuneRun) -> str:
    """"k of n" repetitions of ``run`` disturbed by other processes."""
    seen = disturbance.run_summary(run.records)
    return f"{seen['disturbed']} of {seen['repetitions']}"


def trail(run: C.TuneRun) -> str:
    """The run's trials in order, one short line each (role, settings as the progress line shows them,
    request median, disturbed repetitions), for reading why a run picked what it picked."""
    lines = []
    for i, r in enumerate(run.records):
        dist = r.extra.get(disturbance.KEY) or {}
        req = f"{r.request.median:.3f} s" if r.request else r.outcome.status
        lines.append(f"    {i:2d} {str(r.role):10s} {short_settings(r.settings)} {req}"
                     + (f" disturbed {dist.get('disturbed')}/{dist.get('repetitions')}" if dist else ""))
    return "\n".join(lines)


def run_figures(run: C.TuneRun) -> str:
    """Where a run's time went (issue 44): trials and seconds per role (baselines, search, composites,
    confirmation), the share of the run's wall time inside trials, and inside the complete trials the share
    that was timed work (the rest: model load, warm-up, process start), and the largest trial's peak memory."""
    roles: dict[str, list[R.TrialRecord]] = {}
    for r in run.records:
        roles.setdefault(str(r.role), []).append(r)
    per_role = ", ".join(f"{name} {len(rs)} trials {sum(r.outcome.wall_s for r in rs):.0f}s"
                         for name, rs in roles.items())
    inside = sum(r.outcome.wall_s for r in run.records)
    parts = [quality.breakdown(r.outcome.wall_s, r.outcome.result) for r in run.records
             if r.outcome.status == R.OK and r.outcome.result and r.outcome.result.get("timed_s")]
    wall = max(sum(p["wall"] for p in parts), 1e-9)
    timed, load = (sum(p[name] for p in parts) / wall for name in ("timed", "load"))
    peaks = [r.outcome.memory.peak_rss for r in run.records]
    return (f"time per stage: {per_role}; inside trials {inside / run.wall_s:.0%} of {run.wall_s:.0f}s "
            f"(the rest: profile, quantizing, sampler, storage); in {len(parts)} complete trials timed work "
            f"{timed:.0%} of their wall time, overhead {1 - timed:.0%} (model load {load:.0%}, warm-up and "
            f"process start the rest); largest peak memory {max(peaks, default=0) / 2**30:.2f} GiB")


def run_name(budget: float, seed: int, mode: str, both: bool) -> str:
    """The name of one tuning run in the tables: "120s seed 0", with " noise"/" quiet" when both kinds run."""
    return f"{budget:.0f}s seed {seed}" + (f" {mode}" if both else "")


def report(budget: float, mode: str, a: Any, ties: list[str], out: dict[str, list[Any]],
           runs: dict[int, C.TuneRun], ok: list[dict[str, Any]]) -> None:
    """The lines of one budget (and mode): ratios to the grid optimum over seeds, goals met, seconds to 3%."""
    goal = a.goal or (0.9 if budget <= 300 else 0.97)
    opt, label = ties[0], f"{budget:.0f}s" + (f" {mode}" if a.both else "")
    per_seed: dict[str, list[float]] = {figure: [] for figure in FIGURES}
    met_tied = 0
    for seed in runs:
        name = run_name(budget, seed, mode, a.both)
        if name not in out:
            continue
        for figure in FIGURES:
            ratios = _ratios(out[name], out[opt], figure)
            if ratios:
                per_seed[figure].append(C.median(ratios))
        met_tied += any(_meets(out[name], out[t], goal) for t in ties)
    both = sum(1 for p, d in zip(per_seed["prefill"], per_seed["decode"]) if min(p, d) >= goal)
    requests = sum(1 for r in per_seed["request"] if r >= goal)
    print(f"budget {label}, recommendation / grid optimum: prefill {C.spread(per_seed['prefill'], 'x')}; "
          f"decode {C.spread(per_seed['decode'], 'x')}; request speed {C.spread(per_seed['request'], 'x')} "
          f"(per seed: {', '.join(f'{r:.3f}' for r in per_seed['request'])}); "
          f"request-time goal ({goal:.0%}) met by {requests} of {len(per_seed['request'])} seeds; "
          f"goal on prefill and decode at once met by {both} of {len(per_seed['prefill'])} seeds against {opt}, "
          f"by {met_tied} against one of the {len(ties)} tied optima")
    reach = [run.seconds_to(ok[0]["request"] * (1 + WITHIN)) for run in runs.values()]
    print(f"budget {label}: seconds to within 3% of the grid optimum's request time: "
          f"{C.spread([r for r in reach if r is not None], ' s', 0)}; never in {sum(r is None for r in reach)} runs; "
          f"confirmation trials cut: {sum(cut_confirmations(r) for r in runs.values())}")


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__)
    p.add_argument("--budgets", help="comma-separated tuning budgets (default 2m,10m; --quick: 20s)")
    p.add_argument("--seeds", type=int, help="runs per budget (default 3; --quick: 1)")
    p.add_argument("--rounds", type=int, help="interleaved re-measurement rounds (default 3; --quick: 1)")
    p.add_argument("--repetitions", type=int, help="timed repetitions per trial (default 3; --quick: 1)")
    p.add_argument("--grid", type=Path, help="the exhaustive space (default: spaces/grid.yaml)")
    p.add_argument("--space", type=Path, help="the space tune() searches (default: autotune's default)")
    p.add_argument("--noise", action="store_true", help="a bounded background CPU load during the tuning runs")
    p.add_argument("--busy", action="store_true", help="a steady nice-19 load on one CPU through the tuning runs and "
                   "their re-measurement against llama.cpp's defaults (benchmarks/busy.py; default budget 2m)")
    p.add_argument("--both", action="store_true", help="each seed twice, quiet and with --noise, against one grid "
                   "and one re-measurement")
    p.add_argument("--goal", type=float, help="share of the optimum's speed to reach (default 0.90 up to 5m, else 0.97)")
    p.add_argument("--top", type=int, default=3, help="the grid's best configs re-measured with the picks (default 3)")
    p.add_argument("--model", help="a GGUF file to run on (default: the bundled model), e.g. a made model")
    p.add_argument("--quants", help=f"comma-separated weight types of the grid (default with --model: {MODEL_QUANTS}; "
                   "else the grid file's)")
    p.add_argument("--workload", help="the workload (default: default; --quick: tiny)")
    p.add_argument("--screen", type=int, help="measure the grid with one repetition, then only its N fastest with "
                   "--repetitions (default: all with --repetitions; a grid of a 1.5B model otherwise takes hours)")
    p.add_argument("--reuse-grid", action="store_true", help="read the grid's table an earlier run with the same "
                   "arguments kept in --cache-dir instead of measuring it again (the re-measurement still runs)")
    a = p.parse_args(argv)
    budgets = [parse_duration(b) for b in (a.budgets or ("20s" if a.quick else "2m" if a.busy else "2m,10m")).split(",")]
    seeds, rounds = a.seeds or (1 if a.quick else 3), a.rounds or (1 if a.quick else 3)
    reps = a.repetitions or (1 if a.quick else 3)
    grid_path = a.grid or C.SPACES_DIR / ("grid-quick.yaml" if a.quick else "grid.yaml")
    space = a.space or (C.SPACES_DIR / "quick.yaml" if a.quick else Path(DEFAULT_SPACE))
    workload = get_workload(a.workload or ("tiny" if a.quick else "default"))
    machine = C.Machine.detect(a.model)
    if a.busy:
        C.header("a busy machine tuned as it is: autotune run's recommendation vs llama.cpp's defaults, both under "
                 "the same steady load", machine, search_space=space, workload=workload.name,
                 budgets=", ".join(f"{b:.0f}s" for b in budgets), seeds=seeds, re_measurement=f"{rounds} interleaved "
                 f"rounds, {reps} repetitions per trial", load="one process at nice 19 spinning on one CPU, through "
                 "the tuning runs and the re-measurement")
        return busy.run(machine, budgets, seeds, rounds, reps, space, workload, a.model)
    quants = a.quants or (MODEL_QUANTS if a.model else None)
    if quants:
        grid_path = with_quants(grid_path, quants.split(","), machine.model.file_type, a.cache_dir)
    C.header("against the exhaustive optimum: autotune run's recommendation vs the grid's best", machine,
             grid=grid_path, weight_types=quants or "the grid file's", search_space=space, workload=workload.name, budgets=", ".join(f"{b:.0f}s" for b in budgets),
             grid_measurement=f"each config with one repetition, the {a.screen} fastest again with {reps}"
             if a.screen else f"each config with {reps} repetitions",
             seeds=seeds, re_measurement=f"{rounds} interleaved rounds, {reps} repetitions per trial",
             noise=(("each run twice, quiet and " if a.both else "") + "one CPU busy 2-8 s at random intervals during "
                    "the tuning runs") if a.noise or a.both else "none")
    grid = measure_grid(machine, grid_path, workload, reps, a.screen, a.cache_dir, a.reuse_grid)
    ok = sorted((r for r in grid if "request" in r), key=lambda r: r["request"])
    if not ok:
        print("grid: no config could be measured")
        return 1
    kept = f" (by an earlier run, kept in {grid[0]['kept']})" if grid[0].get("kept") else ""
    print(f"grid: {len(grid)} configs measured in {sum(r['wall_s'] for r in grid):.0f}s{kept}; best {ok[0]['key']}: "
          f"request {ok[0]['request']:.3f} s, prefill {ok[0]['prefill']:.1f} t/s, decode {ok[0]['decode']:.1f} t/s")
    modes = ["quiet", "noise"] if a.both else (["noise"] if a.noise else ["quiet"])
    runs: dict[str, C.TuneRun] = {}
    for budget in budgets:
        for seed in range(seeds):
            for mode in modes:
                with C.Noise(seed) if mode == "noise" else contextlib.nullcontext():
                    run = C.run_tune(budget, space, workload.name, reps, seed, model=a.model)
                name = run_name(budget, seed, mode, a.both)
                runs[name] = run
                print(f"trials of {name}:\n{trail(run)}", file=sys.stderr, flush=True)
                best = run.best()
                reached = run.seconds_to(ok[0]["request"] * (1 + WITHIN))
                print(f"budget {name}: {run.result.trials_run} trials, elapsed {run.wall_s:.1f}s "
                      f"(promise {budget + grace_s(budget):.0f}s: {'kept' if run.wall_s <= budget + grace_s(budget) else 'BROKEN'}); "
                      f"within 3% of the grid optimum after "
                      f"{'never' if reached is None else f'{reached:.0f}s'}; confirmation trials cut: {cut_confirmations(run)}; "
                      f"repetitions disturbed: {disturbed(run)}; recommends {best.config_key if best else None}")
                print(f"budget {name}: {run_figures(run)}")
    configs = {f"grid #{i + 1}": r["settings"] for i, r in enumerate(ok[:a.top])}
    for name, run in runs.items():
        best = run.best()
        if best is not None:
            configs[name] = TrialSettings(**best.settings)
    out = C.interleave(machine.model, configs, workload, rounds, reps)
    grid_names = [n for n in configs if n.startswith("grid #")]
    # The optimum is the grid config with the shortest re-measured request time (the three are close).
    ties = tied_optima(out, grid_names)
    if not ties:
        print("grid: none of its best configs could be re-measured")
        return 1
    opt = ties[0]
    for name in configs:  # the grid's best, then each run's pick
        print(f"{name} re-measured: {config_key(configs[name])}: "
              f"request {C.spread(C.samples(out[name], 'request_s'), ' s', 3)}, "
              f"prefill {C.spread(C.samples(out[name], 'prefill_tps'), ' t/s', 1)}, "
              f"decode {C.spread(C.samples(out[name], 'decode_tps'), ' t/s', 1)}")
    print(f"grid optimum re-measured: {opt}; tied with it on request time (within the measured spread): "
          f"{', '.join(ties[1:]) or 'none'}")
    for budget in budgets:
        for mode in modes:
            report(budget, mode, a, ties, out, {s: runs[run_name(budget, s, mode, a.both)] for s in range(seeds)}, ok)
    return 0


if __name__ == "__main__":
    sys.exit(main())
