"""Every minute buys progress: adaptive repetitions, pruned trials that keep their figures, and the
composite of the best decode and prefill settings, measured before it is recommended."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.search import composite, refine, remeasure
from tuner.selection import candidates as select
from tuner.measure import records as R
from tuner.backends import protocol
from tuner.measure import disturbance
from tuner.config.model import resolve_model
from tuner.search.progress import Progress
from tuner.measure.records import Stat, record_of
from tuner.measure.runner import run_child
from tuner.search.tune import TuneOptions, tune
from tuner.backends.settings import TrialSettings, config_key, normalize
from tuner.results.storage import open_storage
from tuner.search.state import TrialContext
from tuner.search.stopping import adaptive_rule
from tuner.search.trial import run_trial
from tuner.config.workloads import get_workload


def _stat(v: float) -> Stat:
    return Stat(median=v, cv=0.01, min=v, max=v, n=3, samples=(v, v, v))


def cand(prefill: float, decode: float, **settings) -> select.Candidate:
    full, _ = normalize(TrialSettings(n_ctx=256, **settings))
    return select.Candidate(config_key=config_key(full), settings=full.model_dump(), trials=(0,), roles=("search",),
                            prefill=_stat(prefill), decode=_stat(decode), ttft=_stat(64 / prefill), peak_rss=1,
                            request=_stat(64 / prefill + 16 / decode))


def test_adaptive_repetitions_stop_on_a_small_spread_and_go_on_while_it_is_large() -> None:
    try:
        protocol.adapt(adaptive_rule(3))
        assert protocol.more_repetitions({"request_s": [1.0]}, 3)                    # below the minimum of 2
        assert not protocol.more_repetitions({"request_s": [1.0, 1.01]}, 3)           # CV 0.7%: enough
        assert protocol.more_repetitions({"request_s": [1.0, 1.3]}, 3)                # CV 18%: one more
        assert not protocol.more_repetitions({"request_s": [1.0, 1.3, 1.0]}, 3)       # the cap: the ask
    finally:
        protocol.adapt(None)
    assert protocol.more_repetitions({"request_s": [1.0, 1.0]}, 3)  # fixed: exactly what was asked
    assert not protocol.more_repetitions({"request_s": [1.0, 1.3, 1.0]}, 3)


def test_the_composite_takes_each_figures_settings_from_its_fastest_relative() -> None:
    decoder = cand(300, 100, n_threads=2, n_threads_batch=1, n_batch=64)
    prefiller = cand(600, 60, n_threads=1, n_threads_batch=2, n_batch=256)
    other_weights = cand(900, 120, n_threads=1, n_threads_batch=2, n_batch=256, flash_attn=True)
    guess = composite.propose([decoder, prefiller], "request_time")
    assert guess is not None and (guess.n_threads, guess.n_threads_batch, guess.n_batch) == (2, 2, 256)
    assert guess.flash_attn == decoder.settings["flash_attn"]  # a shared setting is the best config's
    # Once measured (or tried), it is not proposed again; other weights are never mixed in.
    measured = cand(650, 105, n_threads=2, n_threads_batch=2, n_batch=256)
    assert composite.propose([decoder, prefiller, measured], "request_time") is None
    assert composite.propose([decoder, prefiller], "request_time", {config_key(guess)}) is None
    assert composite.propose([other_weights, decoder], "request_time") is None
    hf = select.Candidate(config_key="hf", settings={"backend": "transformers"}, trials=(1,), roles=("baseline",),
                          prefill=_stat(900), decode=_stat(200), ttft=None, peak_rss=1, request=_stat(0.1))
    assert composite.propose([hf], "request_time") is None  # a backend without figure settings


def test_the_reserve_keeps_back_only_a_re_measure_that_fits() -> None:
    from dataclasses import replace

    from tuner.search.remeasure import reserve_seconds

    base = replace(cand(300, 60, n_threads=1), roles=("baseline",), wall_s=8.0)
    winner = replace(cand(600, 100, n_threads=2), wall_s=8.0)
    # Every trial is planned at 1.25x its typical time (10 s here), the margin a round must fit with.
    # Both fit in a 10-minute budget's share (180 s), so precision comes next: four rounds of 20 s, and
    # room for one deciding round of the two (20 s).
    assert reserve_seconds([base, winner], TuneOptions(budget_s=600)) == pytest.approx(100.0)
    # 2 minutes allow 30% = 36 s: three rounds of the winner alone (30 s), which compare nothing; three of the
    # two (60 s) do not fit in 45% (54 s) either, two rounds of the two do (40 s), and no fourth round is kept.
    assert reserve_seconds([base, winner], TuneOptions(budget_s=120)) == pytest.approx(40.0)
    # A re-measure longer than the whole share keeps nothing back (it could never run); nor does a stage that
    # fits one config alone (issue 41: it compares nothing, its time is the search's), unless one was asked for.
    slow = replace(winner, wall_s=30.0)
    assert reserve_seconds([base, slow], TuneOptions(budget_s=120)) == 0.0
    assert reserve_seconds([base, slow], TuneOptions(budget_s=120, remeasure=1)) == pytest.approx(30.0)
    assert reserve_seconds([replace(base, wall_s=30.0), slow], TuneOptions(budget_s=120)) == 0.0


def test_the_winners_runners_up_are_re_measured_after_it_and_its_baseline() -> None:
    from dataclasses import replace

    from tuner.search.remeasure import reserve_seconds, to_remeasure

    base = replace(cand(300, 60, n_threads=1), roles=("baseline",), wall_s=8.0)
    winner = replace(cand(600, 100, n_threads=2), wall_s=8.0)
    second = replace(cand(590, 99, n_threads=2, flash_attn=True), wall_s=8.0)
    third = replace(cand(580, 98, n_threads=2, n_batch=128), wall_s=8.0)
    decoder = replace(cand(100, 130, n_threads=2, n_batch=64), wall_s=8.0)  # fastest decode, slow request
    cands = [base, decoder, third, second, winner]
    order = [c.config_key for c in to_remeasure(cands, TuneOptions(budget_s=600))]
    # Most needed first: the winner, its baseline, then the runners-up by the objective (not the picks).
    assert order == [winner.config_key, base.config_key, second.config_key, third.config_key]
    # Trials planned at 1.25 x 8 s = 10 s. Ten minutes keep four rounds of all four back (4 x 40 s) and a
    # deciding round of two (20 s). Two minutes allow 36 s: three rounds of the winner, then neither the
    # baseline's nor a runner-up's 30 s more; so two rounds of the winner and its baseline (40 s, within 45%).
    assert reserve_seconds(cands, TuneOptions(budget_s=600)) == pytest.approx(180.0)
    assert reserve_seconds(cands, TuneOptions(budget_s=120)) == pytest.approx(40.0)
    # A baseline too slow to re-measure in the share is passed over; the first runner-up that fits is kept.
    cands = [replace(base, wall_s=30.0), decoder, replace(third, wall_s=3.0), replace(second, wall_s=3.0),
             replace(winner, wall_s=6.0)]
    assert reserve_seconds(cands, TuneOptions(budget_s=120)) == pytest.approx(33.75)  # winner 22.5 + second 11.25
    # What fits in the time left runs in interleaved rounds, every other one reversed (drift falls on all alike).
    planned = remeasure.plan(cands, TuneOptions(budget_s=600), 36.0)
    assert [c.config_key for c in planned] == [winner.config_key, second.config_key]  # the baseline's 112.5 s do not fit
    w, s = winner.config_key, second.config_key
    assert [c.config_key for c in remeasure.rounds(planned)] == [w, s, s, w, w, s]
    assert [c.config_key for c in remeasure.schedule(cands, TuneOptions(budget_s=600), 36.0)] == \
        [w, s, s, w, w, s]  # 2 of the 4 wanted configs: no fourth round
    # Each run confirms anew, even a config an earlier run measured thoroughly: the stage compares side by side.
    thorough = replace(winner, prefill=Stat.of([600.0] * 9))
    assert winner.config_key in [c.config_key for c in to_remeasure([base, second, thorough], TuneOptions())]


def test_a_child_stopped_after_its_first_repetition_keeps_it(model_path: Path, repack_ok: bool) -> None:
    spec = {"model_path": str(model_path), "settings": TrialSettings(n_ctx=256, repack=repack_ok).model_dump(),
            "workload": get_workload("tiny").model_dump(), "repetitions": 5, "warmup": True}
    seen: list[int] = []

    def stop(figures: dict) -> str | None:
        seen.append(len(figures["request_s"]))
        return "enough" if len(figures["request_s"]) >= 1 else None

    out = run_child(spec, timeout_s=120, memory_ceiling=4 << 30, on_repetition=stop)
    assert out.status == R.PRUNED and out.reason == "enough" and seen == [1], out.stderr_tail
    assert out.ok and len(out.result["request_s"]) == 1 and out.result["decode_tps"][0] > 0


@pytest.mark.slow
def test_a_pruned_trial_is_pruned_in_the_study_with_its_figures(model_path: Path, sqlite_url: str, repack_ok: bool) -> None:
    storage = open_storage(sqlite_url)
    # A pruner that prunes anything slower than a request of 1 ms: this trial, after its first repetition.
    study = optuna.create_study(study_name="prune", storage=storage.rdb, direction="minimize",
                                pruner=optuna.pruners.ThresholdPruner(upper=0.001))
    ctx = TrialContext(storage=storage, study=study, model=resolve_model(model_path), workload=get_workload("tiny"),
                       objective="request_time", repetitions=3, memory_ceiling=4 << 30, timeout_s=120,
                       progress=Progress())
    rec = run_trial(ctx, study.ask(), TrialSettings(n_ctx=256, repack=repack_ok), "search", adaptive=True)
    assert rec.outcome.status == R.PRUNED and "pruned after 1 repetition" in rec.outcome.reason
    frozen = study.get_trials()[0]
    assert frozen.state == TrialState.PRUNED and frozen.intermediate_values[1] == pytest.approx(rec.request.median)
    assert record_of(frozen).request.n == 1 and select.candidates(study)  # its figures still count
    kept = run_trial(ctx, study.ask(), TrialSettings(n_ctx=256, repack=repack_ok), "baseline")  # not adaptive: never pruned
    assert kept.outcome.status == R.OK and kept.request.n == 3


@pytest.mark.slow
def test_a_baseline_far_slower_than_another_backends_best_stops_after_an_undisturbed_repetition(
        model_path: Path, sqlite_url: str, repack_ok: bool) -> None:
    storage = open_storage(sqlite_url)
    study = optuna.create_study(study_name="outclassed", storage=storage.rdb, direction="minimize")
    ctx = TrialContext(storage=storage, study=study, model=resolve_model(model_path), workload=get_workload("tiny"),
                       objective="request_time", repetitions=3, memory_ceiling=4 << 30, timeout_s=120,
                       progress=Progress())
    settings = TrialSettings(n_ctx=256, repack=repack_ok)
    # The best config so far requests in 1 ms: these defaults, at a small share of its speed, cannot win.
    rec = run_trial(ctx, study.ask(), settings, "baseline", outclassed_by=-0.001)
    # It stops at its first repetition no other process disturbed (on a busy test machine, maybe not the first).
    disturbed = rec.extra.get(disturbance.KEY, {}).get("disturbed", 0)
    assert rec.outcome.status == R.PRUNED or disturbed >= 3, (rec.outcome.status, rec.extra.get(disturbance.KEY))
    if rec.outcome.status == R.PRUNED:
        assert f"stopped after {rec.request.n} repetition" in rec.outcome.reason and rec.request.n <= 1 + disturbed
    assert select.candidates(study)[0].roles == ("baseline",)  # measured, and counts as the baseline
    # Against a best config slower than these defaults every asked repetition runs.
    kept = run_trial(ctx, study.ask(), settings, "baseline", outclassed_by=-100 * rec.request.median)
    assert kept.outcome.status == R.OK and kept.request.n == 3


def test_only_an_undisturbed_repetition_far_slower_than_the_best_stops_a_trial() -> None:
    from types import SimpleNamespace

    from tuner.search.stopping import _outclassed

    check = _outclassed(SimpleNamespace(objective="request_time"), -1.0)  # the best so far: 1 s a request
    quiet, busy = [{"disturbed": False}], [{"disturbed": True}]
    assert "stopped after 1 repetition" in check({"request_s": [2.5], disturbance.KEY: quiet})   # 40% of its speed
    assert check({"request_s": [2.5], disturbance.KEY: busy}) is None   # slow maybe for another process
    assert check({"request_s": [1.8], disturbance.KEY: quiet}) is None  # 56%: it goes on
    assert check({"request_s": [], disturbance.KEY: busy}) is None      # a replaced repetition: nothing yet


@pytest.mark.alone  # measures speed, or needs every CPU (tests/parallel.py)
@pytest.mark.slow
def test_a_run_measures_composites_and_prunes_with_optuna(sqlite_url: str, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("version: 1\nparams:\n  n_threads: {low: 1, high: auto}\n  n_threads_batch: {low: 1, high: auto}\n"
                     "  n_batch: {choices: [16, 64]}\n  n_ubatch: {choices: [16, 64]}\n")
    # 60 s: the stage needs 3 rounds of at least one config at 1.25x its trial time inside the 30% reserve (18 s),
    # which fits trials of up to 4.8 s; 40 s (12 s) left a slower CI machine without a stage.
    result = tune(TuneOptions(budget_s=60, space=str(space), workload="tiny", storage=sqlite_url, repetitions=2,
                              max_quality_loss=None, seed=4))
    study = optuna.load_study(study_name=result.study_name, storage=open_storage(sqlite_url).rdb)
    recs = [(t, record_of(t)) for t in study.get_trials() if record_of(t)]
    search = [(t, r) for t, r in recs if r.role == "search" and r.outcome.ok]
    assert search and all(t.intermediate_values for t, _ in search)  # every repetition was reported
    assert all(1 <= r.request.n <= 2 for _, r in search)  # adaptive: never more than the ask
    refined = [(t, r) for t, r in recs if t.user_attrs.get(refine.REFINE_ATTR)]
    assert refined, "no local refinement ran"
    for t, r in refined:  # each changes the named setting of a config measured before it, and nothing else
        name = t.user_attrs[refine.REFINE_ATTR]
        assert any(f"with {name} changed" in n for n in r.notes)
        assert any([k for k in r.settings if r.settings[k] != e.settings.get(k)] == [name]
                   for u, e in recs if u.number < t.number)
    for t, r in recs:
        if r.role == "composite":
            assert composite.NOTE in r.notes
        if r.outcome.status == R.PRUNED:
            assert t.state == TrialState.PRUNED and r.request is not None
    # The confirmation stage: every re-measure carries this run's stage, and the recommendation is one of
    # its configs, with the stage's figures alone.
    confirm = [(t, r) for t, r in recs if r.role == "remeasure"]
    assert confirm, f"no confirmation stage; trial walls {[round(r.outcome.wall_s, 1) for _, r in recs]} s"
    assert len({t.user_attrs.get(select.CONFIRM_ATTR) for t, _ in confirm}) == 1
    assert None not in {t.user_attrs.get(select.CONFIRM_ATTR) for t, _ in confirm}
    figures = result.recommendation["figures"]
    assert figures["confirmed"] and set(figures["trials"]) <= {t.number for t, _ in confirm}
    assert result.recommendation["settings"] in [r.settings for _, r in confirm]


@pytest.mark.slow
def test_a_tpe_sample_of_a_measured_config_is_told_its_figures_not_measured_again(sqlite_url: str,
                                                                                 tmp_path: Path) -> None:
    from tuner.recommend.query import trial_rows

    # Two configs in all: once both are measured (informed start, then its one neighbour), every TPE
    # sample repeats one of them.
    space = tmp_path / "space.yaml"
    space.write_text("version: 1\nparams:\n  n_batch: {choices: [16, 64]}\n")
    result = tune(TuneOptions(budget_s=60, space=str(space), workload="tiny", storage=sqlite_url, repetitions=1,
                              max_quality_loss=None, seed=2, remeasure=0))
    study = optuna.load_study(study_name=result.study_name, storage=open_storage(sqlite_url).rdb)
    trials = study.get_trials()
    repeats = [t for t in trials if record_of(t) and record_of(t).outcome.status == R.REPEAT]
    assert repeats, "no TPE sample repeated a measured config: the space was not exhausted"
    measured = {record_of(t).config_key for t in trials if record_of(t) and record_of(t).outcome.ok}
    for t in repeats:  # told the figures of a config measured before it; its record says so and holds no figures
        rec = record_of(t)
        assert t.state == TrialState.COMPLETE and t.values and rec.config_key in measured
        assert rec.prefill is None and "again" in rec.outcome.reason
    assert not {t.number for t in repeats} & {t.number for t, _ in select.records(study)}  # never a measurement
    # A config is measured again by a TPE sample only after three repeats in a row were told.
    order = [record_of(t).outcome.status if record_of(t).outcome.status == R.REPEAT else record_of(t).role
             for t in trials if record_of(t)]
    searched = [i for i, role in enumerate(order) if role == "search"]
    for i in searched[2:]:  # after the informed start and its neighbour
        assert order[i - 3:i] == [R.REPEAT] * 3
    rows = {r["number"]: r for r in trial_rows(study)}
    assert {rows[t.number]["state"] for t in repeats} == {"repeat"}
    assert all(rows[t.number]["config_key"] == record_of(t).config_key for t in repeats)
