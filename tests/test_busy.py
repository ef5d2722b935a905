"""Issue 41 items 3 and 4: a busy machine is tuned as it is, and no trial starts that cannot pay.

Decided on stored figures and fed numbers (:func:`tuner.measure.load.of_readings`); the one real run is
marked slow and alone."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from fixtures.stored import add_measured
from tuner.backends import protocol
from tuner.backends.settings import TrialSettings
from tuner.measure import disturbance
from tuner.measure import load as machine_load
from tuner.measure.spec import TrialSpec
from tuner.search import informed, refine, remeasure, step
from tuner.search.state import Run
from tuner.search.space import load_space
from tuner.search.stopping import OUTCLASSED_SHARE, _outclassed
from tuner.search.tune import TuneOptions
from tuner.selection import candidates as select

BUSY = machine_load.of_readings(1.0, 1.0, 2)    # a compile kept one of two CPUs busy over the 1-s probe
QUIET = machine_load.of_readings(1.0, 0.02, 2)


def test_the_start_probe_says_how_much_other_processes_keep_busy() -> None:
    assert BUSY.busy and BUSY.share == 0.5 and BUSY.free_cpus() == 1
    assert not QUIET.busy and QUIET.free_cpus() == 2
    big = machine_load.of_readings(2.0, 1.0, 16)   # half a CPU of sixteen: busy, fewer threads than CPUs
    assert big.busy and big.other_cpus == 0.5 and big.free_cpus() == 15
    assert machine_load.of_readings(1.0, 4.0, 2).free_cpus() == 1   # never fewer than one
    line = BUSY.text(120)
    assert "busy" in line and "1.0 of this run's 2 CPU(s)" in line and "50%" in line and "at most 18 s" in line
    assert "quiet" in QUIET.text(120)
    assert machine_load.MachineLoad.of(BUSY.public()) == BUSY


def test_the_probe_measures_the_machine_for_real(monkeypatch: pytest.MonkeyPatch) -> None:
    start = time.monotonic()
    seen = machine_load.probe(2, seconds=0.2)
    assert 0.15 < time.monotonic() - start < 1.0 and seen.cpus == 2 and seen.other_cpus >= 0.0
    # What other processes took: the machine's busy CPU seconds less this process's own.
    readings = iter([(0.0, 10.0, 0.0, 1.0), (1.0, 11.6, 0.0, 1.1)])
    monkeypatch.setattr(disturbance, "_now", lambda: next(readings))
    monkeypatch.setattr(machine_load.time, "sleep", lambda s: None)
    assert machine_load.probe(2).other_cpus == pytest.approx(1.5)


def test_waiting_for_a_quiet_machine_is_bounded_by_a_share_of_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = {"wall_s": 1.0, "other_cpu_s": 1.0, "disturbed": True}
    assert disturbance.wait_left([busy], 5.0) == 5.0      # the run's share left is below the trial's cap
    assert disturbance.wait_left([busy], 0.0) == 0.0      # spent: no more waiting
    assert disturbance.wait_left([{**busy, "waited_s": 4.0}, busy], 6.0) == 2.0
    assert disturbance.wait_left([busy], 100.0) == disturbance.MAX_WAIT_S   # the per-trial caps still hold
    run = SimpleNamespace(options=SimpleNamespace(budget_s=120), waited_s=10.0)
    assert Run.wait_left(run) == pytest.approx(0.15 * 120 - 10.0)   # 15% of a 2-minute budget, 10 s spent
    assert Run.wait_left(SimpleNamespace(options=SimpleNamespace(budget_s=120), waited_s=30.0)) == 0.0
    # The child is told what is left and waits no longer.
    spec = TrialSpec.of("m.gguf", {"backend": "llama_cpp"}, {"name": "w", "prompt_tokens": 8, "generate_tokens": 4}, 3,
                        max_wait_s=3.0)
    assert spec.max_wait_s == 3.0
    limits: list[float] = []
    monkeypatch.setattr(disturbance, "wait_for_quiet", lambda limit: limits.append(limit) or limit)
    monkeypatch.setattr(protocol, "_watched", [busy])
    try:
        protocol.allow_wait(3.0)
        assert protocol.more_repetitions({"request_s": [1.0]}, 3) and limits == [3.0]
        protocol.allow_wait(None)
        assert protocol.more_repetitions({"request_s": [1.0]}, 3) and limits[-1] == disturbance.MAX_WAIT_S
    finally:
        protocol.allow_wait(None)
        protocol._watch.stop()


def test_a_busy_machine_screens_thread_counts_first_fewer_threads_first(tmp_path: Path) -> None:
    assert refine.screen_order("llama_cpp")[:2] == ["flash_attn", "repack"]
    assert refine.screen_order("llama_cpp", busy=True)[:2] == ["n_threads", "n_threads_batch"]
    assert refine.screen_order("transformers", busy=True)[0] == "torch_threads"
    path = tmp_path / "space.yaml"
    path.write_text("version: 1\nparams:\n  n_threads: {low: 1, high: 4}\n  n_threads_batch: {low: 1, high: 4}\n"
                    "  flash_attn: {choices: [true, false]}\n")
    space = load_space(path).resolve(cpus=4, needed_ctx=80)
    start = {"n_threads": 3, "n_threads_batch": 4, "flash_attn": True}
    assert [(n, p[n]) for n, p in refine.neighbours(space, start)][:1] == [("flash_attn", False)]
    busy = [(n, p[n]) for n, p in refine.neighbours(space, start, busy=True)]
    assert busy[:4] == [("n_threads", 2), ("n_threads", 1), ("n_threads", 4), ("n_threads_batch", 3)]
    # The informed start runs on the CPUs left free.
    assert informed.informed_configs(space, 4, 4, free_cpus=1) == [{"n_threads": 1, "n_threads_batch": 1,
                                                                    "flash_attn": True}]


def test_a_disturbed_repetition_far_slower_than_the_best_stops_a_trial() -> None:
    ctx = SimpleNamespace(objective="request_time")
    busy = [{"disturbed": True}]
    quiet_bar = _outclassed(ctx, -1.0)               # the best so far: 1 s a request, on a quiet machine
    assert quiet_bar({"request_s": [2.5], disturbance.KEY: busy}) is None   # 40%: maybe slow for the neighbour
    stop = quiet_bar({"request_s": [9.0], disturbance.KEY: busy})           # 11%: not even 4x undisturbed
    assert stop and "stopped after 1 repetition" in stop and "disturbed" in stop
    like_for_like = _outclassed(ctx, -1.0, OUTCLASSED_SHARE)  # the best's figures were disturbed too
    assert like_for_like({"request_s": [2.5], disturbance.KEY: busy})
    assert like_for_like({"request_s": [1.8], disturbance.KEY: busy}) is None


def test_the_disturbed_bar_compares_like_with_like() -> None:
    study = optuna.create_study(direction="minimize")
    add_measured(study, TrialSettings(n_ctx=1024, n_threads=1), 2.0, role="baseline")
    run = SimpleNamespace(busy=False, study=study, options=SimpleNamespace(objective="request_time"))
    assert step.disturbed_bar(run) is None                            # the best's figures are quiet
    assert step.disturbed_bar(SimpleNamespace(busy=True)) == OUTCLASSED_SHARE   # busy from the start
    noisy = optuna.create_study(direction="minimize")
    add_measured(noisy, TrialSettings(n_ctx=1024, n_threads=1), 2.0, role="baseline", extra={
        disturbance.KEY: {"repetitions": 2, "disturbed": 2, "replaced": 0, "other_cpu_share": 0.9,
                          disturbance.KEPT_AT: [0, 1]}})
    assert step.disturbed_bar(SimpleNamespace(busy=False, study=noisy, options=run.options)) == OUTCLASSED_SHARE


def _two_backends() -> optuna.Study:
    study = optuna.create_study(direction="minimize")
    add_measured(study, TrialSettings(n_ctx=1024, n_threads=1), 4.0, role="baseline", wall_s=20.0, repetitions=3)
    add_measured(study, TrialSettings(n_ctx=1024, n_threads=2), 3.0, wall_s=20.0, repetitions=3)
    add_measured(study, TrialSettings(backend="transformers", n_ctx=1024, torch_threads=2), 12.0, role="baseline",
                 wall_s=57.0, repetitions=3, prefill=40.0, decode=10.0)
    return study


def test_a_backend_whose_typical_trial_does_not_fit_before_the_reserve_is_not_started() -> None:
    # A TPE-sampled transformers trial late in a 10-minute run took 57 s (llama.cpp's 20 s) and cut the stage.
    study, options = _two_backends(), TuneOptions(budget_s=600)
    reserve = remeasure.reserve_seconds(select.candidates(study), options)
    assert reserve > 0
    names = ["llama_cpp", "transformers"]
    assert step.backends_that_fit(study, options, reserve + 100.0, names) == names
    assert step.backends_that_fit(study, options, reserve + 30.0, names) == ["llama_cpp"]
    assert step.backends_that_fit(study, options, reserve + 10.0, names) == []
    # Where the stage no longer fits, that time is the search's (as search_on has it).
    assert step.backends_that_fit(study, options, 20.0, names) == names


def test_the_recommendation_records_the_load_and_says_when_it_mixes_busy_and_quiet(tmp_path: Path) -> None:
    from tuner.recommend.summary import load_section

    settings = TrialSettings(n_ctx=1024, n_threads=1)
    study = optuna.create_study(direction="minimize")
    add_measured(study, settings, 2.0, extra={machine_load.KEY: BUSY.public()})
    (cand,) = select.candidates(study)
    section = load_section(study, cand)
    assert section["busy"] and section["other_cpus"] == 1.0 and not section["mixed"]
    assert "busy machine" in section["text"] and "50%" in section["text"]
    add_measured(study, settings, 1.0, extra={machine_load.KEY: QUIET.public()})   # a later run, quiet
    (cand,) = select.candidates(study)
    section = load_section(study, cand)
    assert not section["busy"] and section["mixed"] and "1 trial(s) measured on a busy machine" in section["text"]
    old = optuna.create_study(direction="minimize")
    add_measured(old, settings, 2.0)                                              # before loads were kept
    assert load_section(old, select.candidates(old)[0]) is None


@pytest.mark.all_cpus  # a 2-thread space; measures nothing a neighbour disturbs (tests/parallel.py)
def test_a_run_on_a_quiet_machine_says_when_the_study_was_measured_busy(tmp_path: Path, sqlite_url: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.search import run as run_module
    from tuner.search.progress import Progress

    space = tmp_path / "space.yaml"
    space.write_text("version: 1\nparams:\n  n_threads: {low: 1, high: 2}\n")
    monkeypatch.setattr(machine_load, "probe", lambda cpus, seconds=0: machine_load.of_readings(1.0, 1.0, cpus))
    options = TuneOptions(budget_s=120, space=str(space), workload="tiny", storage=sqlite_url, max_quality_loss=None)
    busy = run_module.prepare(options, Progress())
    assert busy.busy and "machine is busy at the start" in busy.notes[0] and busy.ctx.load["busy"]
    assert busy.wait_left() == pytest.approx(18.0)
    add_measured(busy.study, TrialSettings(n_ctx=1024, n_threads=1), 2.0, extra={machine_load.KEY: busy.ctx.load})
    monkeypatch.setattr(machine_load, "probe", lambda cpus, seconds=0: machine_load.of_readings(1.0, 0.0, cpus))
    quiet = run_module.prepare(options, Progress())
    assert not quiet.busy and not any("machine is busy" in n for n in quiet.notes)
    assert any("earlier trials were measured on a busy machine and this run's machine is quiet" in n
               for n in quiet.notes), quiet.notes


@pytest.mark.alone  # measures speed, or needs every CPU (tests/parallel.py)
@pytest.mark.slow
def test_a_run_on_a_busy_machine_says_so_bounds_its_waiting_and_records_the_load(
        tiny_space: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The start probe is told the machine is busy (one of its CPUs kept busy): the run must say so, wait at
    # most 15% of its budget, start on the CPUs left free and record the load in every trial and the pick.
    from tuner.measure.records import record_of
    from tuner.results.storage import open_storage
    from tuner.search.tune import tune

    monkeypatch.setattr(machine_load, "probe", lambda cpus, seconds=0: machine_load.of_readings(1.0, 1.0, cpus))
    budget = 20
    result = tune(TuneOptions(budget_s=budget, space=str(tiny_space), workload="tiny", storage=sqlite_url,
                              repetitions=2, max_quality_loss=None, seed=3))
    assert "machine is busy at the start" in result.notes[0]
    study = optuna.load_study(study_name=result.study_name, storage=open_storage(sqlite_url).rdb)
    recs = [r for r in map(record_of, study.get_trials()) if r is not None and r.outcome.ok]
    assert recs and all(r.extra.get(machine_load.KEY, {}).get("busy") for r in recs)
    waited = sum((r.extra.get(disturbance.KEY) or {}).get(disturbance.WAITED, 0.0) for r in recs)
    assert waited <= machine_load.WAIT_SHARE * budget + 0.5, waited   # a wait ends at its poll after the cap
    section = result.recommendation[machine_load.KEY]
    assert section["busy"] and not section["mixed"] and "busy machine" in section["text"]
