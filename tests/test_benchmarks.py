"""The benchmark scripts run in ``--quick`` mode and print their figures (docs/benchmarks/).

These check that each script works end to end and that its key lines appear with numbers that parse,
not what the numbers are. Each test runs one script as a subprocess with its own results folder,
benchmark cache and machine lock; the suite's workers run several side by side (tests/parallel.py), so
the figures are meaningless here, only their presence counts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
TIMEOUT_S = 420
NUMBER = r"([-+]?\d+(?:\.\d+)?)"

sys.path.insert(0, str(BENCH))

from tuner.config.workloads import get_workload  # noqa: E402


def figures(text: str, pattern: str) -> list[float]:
    """The numbers of the first line matching ``pattern`` (NUMBER groups); fails if none matches."""
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"no line matches {pattern!r} in:\n{text}"
    return [float(g) for g in match.groups()]


def check(outputs: dict, name: str) -> str:
    code, stdout, stderr = outputs[name]
    assert code == 0, f"{name}.py --quick failed ({code}):\n{stdout}\n{stderr[-3000:]}"
    assert stdout.startswith("== ") and "load average at start:" in stdout
    return stdout


@pytest.mark.slow
def test_speedup(tmp_path: Path, shared_cache: Path) -> None:
    out = run_alone("speedup", tmp_path, shared_cache)
    for figure in ("prefill", "decode"):
        (ratio,) = figures(out, rf"^{figure} speedup: {NUMBER}x \(min-max .* n=2\)")
        assert ratio > 0
    assert re.search(r"^defaults:\s+backend=llama_cpp;", out, re.MULTILINE)
    assert re.search(r"^recommended:\s+backend=llama_cpp;", out, re.MULTILINE)
    assert figures(out, rf"^tuning: {NUMBER} trials in {NUMBER}s")[0] >= 1


@pytest.mark.slow
def test_regret(tmp_path: Path, shared_cache: Path) -> None:
    out = run_alone("regret", tmp_path, shared_cache)
    assert figures(out, rf"^table: {NUMBER} configs")[0] == 4
    assert figures(out, rf"^true best: {NUMBER} s per request")[0] > 0
    assert "draws its repetitions at random" in out
    for method in ("fixed", "adaptive", "pruned", "adaptive\\+pruned", "refined", "autotune", "random", "grid-shuffled"):
        for threshold in ("10%", "3%"):
            trials, seconds = figures(out, rf"^{method}\s+within {threshold}: {NUMBER} trials .*?; {NUMBER} s")
            assert 1 <= trials <= 17 and seconds > 0
    for threshold in ("10%", "3%"):
        assert figures(out, rf"^seconds to within {threshold}, autotune / fixed .*?: {NUMBER}x")[0] > 0


@pytest.mark.slow
def test_quality(tmp_path: Path, shared_cache: Path) -> None:
    out = run_alone("quality", tmp_path, shared_cache)
    for figure in ("prefill", "decode"):
        assert figures(out, rf"^{figure} CV of trial medians: {NUMBER}%")[0] >= 0
    assert figures(out, rf"^trials per minute of budget: {NUMBER}")[0] > 0
    timed, share = figures(out, rf"^\s+timed inference\s+{NUMBER} s, share of wall {NUMBER}%")
    assert timed > 0 and 0 < share <= 100
    assert figures(out, rf"^\s+model load\s+{NUMBER} s")[0] > 0


@pytest.mark.slow
def test_roofline(tmp_path: Path, shared_cache: Path) -> None:
    out = run_alone("roofline", tmp_path, shared_cache)
    assert figures(out, rf"^memory bandwidth \(1 thread\): {NUMBER} GB/s")[0] > 0
    decode, per_token, gbs, eff = figures(
        out, rf"^source t=1: decode {NUMBER} t/s .* x {NUMBER} MB/token = {NUMBER} GB/s; efficiency {NUMBER}%")
    assert decode > 0 and per_token > 90 and gbs > 0 and eff > 0
    assert figures(out, rf"prefill {NUMBER} t/s .* = {NUMBER} GFLOP/s")[1] > 0


@pytest.mark.slow
def test_budget(tmp_path: Path, shared_cache: Path) -> None:
    out = run_alone("budget", tmp_path, shared_cache)
    for budget in (20, 40):
        elapsed, overrun = figures(out, rf"^budget {budget}s: elapsed {NUMBER}s, overrun {NUMBER}s")
        assert elapsed == pytest.approx(budget + overrun, abs=0.11)
        assert re.search(rf"^budget {budget}s: .*within the promise \({budget + 30}s\): (yes|NO)$", out, re.MULTILINE)


def run_alone(name: str, tmp_path: Path, shared_cache: Path, args: tuple[str, ...] = ("--quick",)) -> str:
    """One script's run (``--quick`` unless ``args`` say otherwise) in a process of its own; its stdout, after
    checking it exited 0."""
    env = {**os.environ, "AUTOTUNE_RESULTS": str(tmp_path / "results"), "AUTOTUNE_CACHE_DIR": str(shared_cache),
           "AUTOTUNE_MACHINE_LOCK": str(tmp_path / "machine.lock"), "PYTHONPATH": str(ROOT)}
    env.pop("AUTOTUNE_FAULT", None)
    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args, "--cache-dir", str(tmp_path / "bc")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=TIMEOUT_S)
    return check({name: (proc.returncode, proc.stdout, proc.stderr)}, name)


@pytest.mark.slow
def test_objective(tmp_path: Path, shared_cache: Path) -> None:
    out = run_alone("objective", tmp_path, shared_cache)
    for pick in ("request-time pick", "geometric-mean pick"):
        assert figures(out, rf"^{pick}\s+request {NUMBER} s")[0] > 0
    assert figures(out, rf"^request time, geometric-mean pick / request-time pick: {NUMBER}x")[0] > 0


@pytest.mark.slow
def test_repack(tmp_path: Path, shared_cache: Path) -> None:
    out = run_alone("repack", tmp_path, shared_cache)
    match = re.search(rf"^Q4_1\s+repack on/off: prefill {NUMBER}x .*; decode {NUMBER}x", out, re.MULTILINE)
    assert match or re.search(r"^Q4_1\s+repacking unusable: Q4_1: repacking crashed", out, re.MULTILINE), out
    if match:
        assert float(match.group(1)) > 0 and float(match.group(2)) > 0


@pytest.mark.all_cpus  # needs every CPU, measures nothing a neighbour disturbs (tests/parallel.py)
@pytest.mark.slow
def test_warmstart(tmp_path: Path, shared_cache: Path) -> None:
    out = run_alone("warmstart", tmp_path, shared_cache)
    assert re.search(rf"^source run: {NUMBER} trials", out, re.MULTILINE)
    assert re.search(r"^seed 0: (target|the cold run)", out, re.MULTILINE)
    assert re.search(r"^seconds to target, warm / cold: ", out, re.MULTILINE)


@pytest.mark.slow
def test_grid(tmp_path: Path, shared_cache: Path) -> None:
    out = run_alone("grid", tmp_path, shared_cache)
    assert figures(out, rf"^grid: {NUMBER} configs measured")[0] == 8  # 2 x 2 batch sizes x flash attention
    elapsed = figures(out, rf"^budget 20s seed 0: {NUMBER} trials, elapsed {NUMBER}s")
    assert elapsed[0] >= 1 and elapsed[1] > 0
    # Where the run's time went (issue 44): seconds per stage, the share inside trials, the trials' overhead.
    n, baseline_s, inside, timed = figures(out, rf"^budget 20s seed 0: time per stage: baseline {NUMBER} trials {NUMBER}s, .*"
                                        rf"inside trials {NUMBER}% .* timed work {NUMBER}% of their wall time")
    assert n >= 1 and baseline_s > 0 and 0 < inside <= 100 and 0 < timed <= 100
    prefill = figures(out, rf"^budget 20s, recommendation / grid optimum: prefill {NUMBER}x")
    assert prefill[0] > 0
    # The optimum is one of the grid's re-measured best, and counted with the configs tied with it.
    assert re.search(r"^grid optimum re-measured: grid #[123]; tied with it on request time", out, re.MULTILINE)
    met = re.search(r"met by (\d) of 1 seeds against grid #[123], by (\d) against one of the ([123]) tied optima",
                    out)
    assert met and int(met[1]) <= int(met[2]) <= 1


def test_helpers() -> None:
    """The pure pieces: spread figures, trials-to-threshold, and the enumeration of a space."""
    import common
    import regret

    from tuner.search.space import load_space

    assert common.spread([1.0, 2.0, 3.0, 4.0, 5.0], "x") == "3.00x (IQR 2.00-4.00, min-max 1.00-5.00, n=5)"
    assert common.spread([]).startswith("n/a")
    curve = regret.Curve(found=[9.0, 5.0, 1.0, 1.0], seconds=[2.0, 4.0, 7.0, 9.0])
    assert regret.first_within(curve, 1.5) == (3, 7.0) and regret.first_within(curve, 0.5) is None
    space = load_space(BENCH / "spaces" / "regret.yaml").resolve(2, 336)
    configs = regret.enumerate_space(space)
    assert len(configs) == 48 and len({c.model_dump_json() for c in configs}) == 48


def test_interleave_measures_one_config_once_a_round_whatever_its_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two seeds recommending one config (or a pick that is the grid optimum) share its trials: one
    measurement per round, so a config never shows two figures and the rounds stay short. The engine is
    replaced here because only the schedule is under test."""
    import common

    from tuner.backends.settings import TrialSettings
    from tuner.measure import records as R

    calls: list[int] = []

    def fake_measure(model, settings, workload, reps):
        calls.append(settings.n_threads)
        return R.TrialOutcome(status=R.ERROR, reason="not measured")

    monkeypatch.setattr(common, "measure", fake_measure)
    a, b = TrialSettings(n_threads=1), TrialSettings(n_threads=2)
    out = common.interleave(None, {"grid #1": a, "seed 0": b, "seed 1": TrialSettings(n_threads=2)}, None, 3, 1)
    assert calls == [1, 2, 2, 1, 1, 2]          # two configs, three alternating rounds
    assert out["seed 0"] is out["seed 1"] and len(out["grid #1"]) == 3 and list(out) == ["grid #1", "seed 0", "seed 1"]


def test_a_screened_grid_measures_its_fastest_again_in_full_and_keeps_its_table(monkeypatch: pytest.MonkeyPatch,
                                                                                 tmp_path: Path) -> None:
    """``--screen N``: every config once with one repetition, the N fastest again with all of them; the table is
    kept, so a second run asked to reuse it (``--reuse-grid``) measures nothing. Only the schedule is under
    test, so the engine is replaced."""
    import common
    import grid

    from tuner.measure import records as R

    calls: list[tuple[int, bool, int]] = []

    def fake_measure(model, settings, workload, reps):
        calls.append((settings.n_batch, settings.flash_attn, reps))
        request = 10.0 - 3 * (settings.n_batch == 512) - settings.flash_attn  # 512 fa on fastest, 128 fa off slowest
        return R.TrialOutcome(status=R.OK, wall_s=1.0, result={"request_s": [request] * reps,
                                                               "prefill_tps": [100.0] * reps, "decode_tps": [10.0] * reps})

    monkeypatch.setattr(common, "measure", fake_measure)
    space = tmp_path / "grid.yaml"
    space.write_text("version: 1\nparams:\n  n_batch: {choices: [128, 512]}\n  flash_attn: {choices: [true, false]}\n")
    machine = common.Machine.detect()
    workload = get_workload("default")  # a 512-token prompt: both batch sizes are distinct configs
    rows = grid.measure_grid(machine, space, workload, 3, screen=2, cache_dir=tmp_path / "cache")
    assert [reps for *_, reps in calls] == [1, 1, 1, 1, 3, 3]
    assert calls[4:] == [(512, True, 3), (512, False, 3)]  # the two fastest of the screening, fastest first
    assert sorted((r["settings"].n_batch, r["screened"], r["reps"]) for r in rows) == \
        [(128, True, 1), (128, True, 1), (512, False, 3), (512, False, 3)]
    again = grid.measure_grid(machine, space, workload, 3, screen=2, cache_dir=tmp_path / "cache", reuse=True)
    assert len(calls) == 6 and [r["key"] for r in again] == [r["key"] for r in rows]
    assert again[0]["settings"] == rows[0]["settings"] and again[0]["kept"]
    grid.measure_grid(machine, space, workload, 3, screen=2, cache_dir=tmp_path / "cache")  # not asked to reuse
    assert len(calls) == 12


def test_tied_optima_are_the_configs_within_the_spread_of_the_shortest_request() -> None:
    import grid

    from tuner.measure import records as R

    def rounds(*request_s: float, prefill: float = 600.0, decode: float = 100.0) -> list[R.TrialOutcome]:
        return [R.TrialOutcome(status=R.OK, result={"request_s": [r], "prefill_tps": [prefill], "decode_tps": [decode]})
                for r in request_s]

    out = {"grid #1": rounds(2.00, 2.03, 1.99, prefill=650, decode=104),   # CV about 1%
           "grid #2": rounds(2.02, 2.01, 2.03, prefill=580, decode=114),   # 1% slower, all of it within 3%: a tie
           "grid #3": rounds(2.30, 2.31, 2.29, prefill=640, decode=84),    # 15% slower: not one
           "seed 0": rounds(2.05, 2.05, 2.05, prefill=650, decode=104)}
    assert grid.tied_optima(out, ["grid #3", "grid #2", "grid #1"]) == ["grid #1", "grid #2"]
    # The same config as the first optimum meets a 97% goal against it, not against the other one.
    assert grid._meets(out["seed 0"], out["grid #1"], 0.97)
    assert not grid._meets(out["seed 0"], out["grid #2"], 0.97)
    assert not grid._meets(out["seed 0"], [R.TrialOutcome(status=R.CRASHED)] * 3, 0.5)  # nothing to compare


def test_the_noise_of_a_noisy_run_is_a_real_process_that_stops_with_it() -> None:
    import common
    import psutil

    with common.Noise(seed=1) as noise:
        process = psutil.Process(noise.process.pid)
        deadline = time.monotonic() + 10  # right after the fork its command line is empty until it execs
        while not process.cmdline() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.is_running() and "random.Random(1)" in " ".join(process.cmdline())
    assert noise.process is None and not psutil.pid_exists(process.pid)



def test_a_busy_run_has_a_steady_nice_load_on_one_cpu_and_is_judged_against_the_defaults(capsys) -> None:
    """grid.py --busy: the load is one process at nice 19 on the last CPU, gone with the block; the report gives
    each seed's request speed against the defaults under that load, and how many seeds met the goal."""
    import busy
    import psutil

    from tuner.measure.records import OK, TrialOutcome

    with busy.Busy() as load:
        process = psutil.Process(load.process.pid)
        deadline = time.monotonic() + 10  # it lowers its own priority once it runs
        while process.nice() != 19 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.nice() == 19 and process.cpu_affinity() == [max(os.sched_getaffinity(0))]
    assert load.process is None and not psutil.pid_exists(process.pid)

    def timed(*seconds: float) -> list[TrialOutcome]:
        return [TrialOutcome(status=OK, result={"request_s": [s]}) for s in seconds]

    busy.report(120, {busy.DEFAULTS: timed(3.0, 3.2), "120s seed 0": timed(2.0, 2.0), "120s seed 1": timed(3.0, 3.2)},
                {"120s seed 0": None, "120s seed 1": None})
    out = capsys.readouterr().out
    assert "busy 120s seed 0: request speed against the defaults under the same load 1.55x" in out
    assert "busy 120s seed 1: request speed against the defaults under the same load 1.00x" in out
    assert re.search(r"^busy 120s: .* goal \(>= 1.3x\) met by 1 of 2 seeds$", out, re.MULTILINE)


@pytest.mark.slow
def test_depth(tmp_path: Path, shared_cache: Path) -> None:
    """Issue 29: the long-prompt pick ranked by decode after the prompt and by decode at depth, side by side."""
    out = run_alone("depth", tmp_path, shared_cache)
    for pick in ("after-prompt pick", "depth pick"):
        deep, after = figures(out, rf"^{pick}\s+request at depth {NUMBER} s .*after the prompt {NUMBER} s")
        assert deep > 0 and after > 0
    assert figures(out, rf"^request time at depth, after-prompt pick / depth pick: {NUMBER}x")[0] > 0


@pytest.mark.slow
def test_serving(tmp_path: Path, shared_cache: Path) -> None:
    """Issue 43: llama-server's defaults, the single-request pick and the serving pick on the real llama-server,
    side by side at 1 and 2 users, from two hand-written recommendation files."""
    import json

    from tuner import AutotuneError
    from tuner.backends.llama_cpp.server_binary import find_llama_server
    from tuner.config.model import bundled_model_path
    from tuner.recommend.document import RECOMMENDATION, write

    try:
        find_llama_server(lambda _line: None, build=False)
    except AutotuneError as exc:
        pytest.skip(f"no llama-server is built here (`autotune build-server`): {exc}")

    def pick(name: str, workload: dict, **settings: object) -> Path:
        doc = RECOMMENDATION.stamp({"model": {"path": str(bundled_model_path())}, "workload": workload,
                                    "settings": {"backend": "llama_cpp", "n_threads": 1, "n_threads_batch": 2,
                                                 "flash_attn": True, **settings},
                                    "llama_server_args": []})
        return write(doc, tmp_path / f"{name}.yaml")

    serve = {"name": "serve", "kind": "serve", "prompt_tokens": 64, "generate_tokens": 16, "users": 2}
    single = pick("single", {"name": "default", "prompt_tokens": 64, "generate_tokens": 16},
                  n_batch=256, n_ubatch=256, n_ctx=512)
    serving = pick("serving", serve, n_batch=512, n_ubatch=256, n_ctx=512, n_parallel=2)
    out = run_alone("serving", tmp_path, shared_cache,
                    ("--serving-pick", str(serving), "--single-pick", str(single), "--users", "1,2", "--rounds", "1",
                     "--window", "2", "--warmup", "0.5", "--json", str(tmp_path / "serving.json")))
    assert re.search(r"^single pick\s+llama-server .*-np 4 --kv-unified", out, re.MULTILINE)
    for users in (1, 2):
        for other in ("single pick", "defaults"):
            # goodput may be 0 on a busy test machine (no request within the targets): 'from 0' or n/a then
            line = re.search(rf"^ratio serving pick / {other} at {users} user\(s\): goodput (\d+\.\d+x|from 0 \(\d+\.\d+ against 0\)|n/a) "
                             rf"\((per round|no round).*; output t/s {NUMBER}x", out, re.MULTILINE)
            assert line and float(line[3]) > 0, out
    assert figures(out, rf"^serving pick\s+{NUMBER} \(min-max .* n=1\)")[0] >= 0
    assert re.search(r"^ratio serving pick / single pick, capacity: ", out, re.MULTILINE)
    assert re.search(r"^goal: goodput at 8 users serving/single = n/a \(goal >= 1.5x\): not judged", out, re.MULTILINE)
    raw = json.loads((tmp_path / "serving.json").read_text())
    assert set(raw["windows"]) == {"defaults", "single pick", "serving pick"} and raw["cpu_model"]


def test_the_grid_on_a_given_model_fixes_its_weight_types(tmp_path: Path) -> None:
    """``grid.py --model PATH --quants ...`` (issue 44): the grid's weight types are those asked, the source's own
    type measured as the source file, its other dimensions those of the grid file."""
    import grid

    from tuner.search.space import load_space

    path = grid.with_quants(BENCH / "spaces" / "grid.yaml", grid.MODEL_QUANTS.split(","), "F16", tmp_path)
    assert grid.with_quants(BENCH / "spaces" / "grid.yaml", grid.MODEL_QUANTS.split(","), "F16", tmp_path) == path
    space = load_space(path).resolve(2, 640)
    assert list(space.distributions["quant"].choices) == ["Q8_0", "Q6_K", "Q4_K_M", "Q4_0", "source"]
    configs = grid.regret.enumerate_space(space)
    assert len(configs) == 5 * 2 * 2 * 2 and {c.n_ctx for c in configs} == {1024}
    quick = grid.with_quants(BENCH / "spaces" / "grid-quick.yaml", ["Q8_0"], "Q4_1", tmp_path)
    assert [c.quant for c in grid.regret.enumerate_space(load_space(quick).resolve(2, 336))] == ["Q8_0"] * 8
