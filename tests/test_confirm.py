"""The confirmation stage: the recommendation is chosen among the configs re-measured side by side at the
end of a run, on those figures alone, so a config that looked best by luck during a long search does not
win (the winner's curse); many lucky variants of one weight type do not crowd out the other weights."""

from __future__ import annotations

from dataclasses import replace

import optuna
from optuna.trial import TrialState, create_trial

from tuner.selection import decision, candidates as select
from tuner.search import remeasure
from tuner.measure import records as R
from tuner.measure.records import Stat
from tuner.search.tune import TuneOptions
from tuner.backends.settings import TrialSettings, config_key, normalize

BASE = {"n_threads": 1, "n_threads_batch": 2}
Q6 = {"quant": "Q6_K", "n_threads": 2, "n_threads_batch": 2, "flash_attn": True}
Q8 = {"quant": "Q8_0", "n_threads": 2, "n_threads_batch": 2, "flash_attn": True}


def _record(role: str, settings: dict, seconds: list[float]) -> R.TrialRecord:
    full, _ = normalize(TrialSettings(n_ctx=1024, **settings))
    return R.TrialRecord(role=role, settings=full.model_dump(), config_key=config_key(full), notes=(),
                         outcome=R.TrialOutcome(status=R.OK, wall_s=8.0, result={"ok": True}),
                         prefill=Stat.of([512 / (s / 2) for s in seconds]), decode=Stat.of([128 / (s / 2) for s in seconds]),
                         request=Stat.of(seconds))


def study_of(trials: list[tuple[str, dict, list[float], str | None]]) -> optuna.Study:
    """An in-memory study whose trials carry real records: (role, settings, request seconds, stage)."""
    study = optuna.create_study(direction="minimize")
    for role, settings, seconds, stage in trials:
        attrs = {R.RECORD_ATTR: _record(role, settings, seconds).public()}
        if stage:
            attrs[select.CONFIRM_ATTR] = stage
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=min(seconds), user_attrs=attrs))
    return study


def key(settings: dict) -> str:
    return _record("search", settings, [1.0]).config_key


def test_the_stage_decides_on_its_own_figures_not_on_the_lucky_search_ones() -> None:
    search = [("baseline", BASE, [3.5, 3.6, 3.4], None),
              ("search", Q6, [1.70, 1.72, 1.71], None),    # measured twice, at lucky moments
              ("search", Q6, [1.70, 1.69, 1.71], None),
              ("search", Q8, [1.90, 1.92, 1.91], None)]
    before = decision.best(select.candidates(study_of(search)), "request_time")
    assert before is not None and before.config_key == key(Q6)
    stage = [("remeasure", Q6, [2.02, 2.05, 2.01]), ("remeasure", Q8, [1.93, 1.95, 1.92]),
             ("remeasure", BASE, [3.5, 3.5, 3.6]), ("remeasure", BASE, [3.5, 3.4, 3.6]),
             ("remeasure", Q8, [1.94, 1.92, 1.93]), ("remeasure", Q6, [2.03, 2.04, 2.05])]
    # Pooled with its lucky search trials, Q6_K would still win (median of 12 samples: 1.86 s against 1.92 s)...
    pooled = decision.best(select.candidates(study_of(search + [(*t, None) for t in stage])), "request_time")
    assert pooled is not None and pooled.config_key == key(Q6)
    # ...but only the stage's figures count, and there Q8_0 is faster.
    cands = select.candidates(study_of(search + [(*t, "run-1") for t in stage]))
    by_key = {c.config_key: c for c in cands}
    q6 = by_key[key(Q6)]
    assert q6.confirmed and q6.request.n == 6 and min(q6.request.samples) >= 2.0 and len(q6.trials) == 2
    chosen = decision.best(cands, "request_time")
    assert chosen is not None and chosen.config_key == key(Q8)
    assert by_key[key(BASE)].confirmed and "baseline" in by_key[key(BASE)].roles  # still found as the baseline


def test_a_config_the_stage_did_not_confirm_is_not_recommended() -> None:
    lucky = {"quant": "Q4_K_M", "n_threads": 2, "n_threads_batch": 2}
    trials = [("baseline", BASE, [3.5, 3.6, 3.4], None), ("search", lucky, [1.2, 1.3, 1.2], None),
              ("remeasure", Q8, [1.9, 1.9, 1.9], "run-1"), ("remeasure", BASE, [3.5, 3.5, 3.6], "run-1")]
    cands = select.candidates(study_of(trials))
    assert decision.best(cands, "request_time").config_key == key(Q8)
    assert not next(c for c in cands if c.config_key == key(lucky)).confirmed


def test_only_the_latest_stage_counts_and_an_older_one_is_pooled_as_before() -> None:
    trials = [("baseline", BASE, [3.5, 3.6, 3.4], None),
              ("remeasure", Q6, [1.5, 1.5, 1.5], "run-1"),     # an earlier run's stage, hours ago
              ("remeasure", Q8, [1.9, 1.9, 1.9], "run-2"), ("remeasure", BASE, [3.4, 3.5, 3.5], "run-2")]
    cands = {c.config_key: c for c in select.candidates(study_of(trials))}
    assert not cands[key(Q6)].confirmed and cands[key(Q8)].confirmed
    assert decision.best(list(cands.values()), "request_time").config_key == key(Q8)


def test_a_stage_that_confirmed_only_the_baseline_does_not_restrict_the_choice() -> None:
    trials = [("baseline", BASE, [3.5, 3.6, 3.4], None), ("search", Q8, [1.9, 1.9, 1.9], None),
              ("remeasure", BASE, [3.4, 3.5, 3.5], "run-1")]
    cands = select.candidates(study_of(trials))
    assert decision.judged(cands) == cands
    assert decision.best(cands, "request_time").config_key == key(Q8)


def test_the_best_of_another_weight_type_is_confirmed_before_more_variants_of_the_winners() -> None:
    cands = select.candidates(study_of(
        [("baseline", BASE, [3.5, 3.6, 3.4], None)]
        + [("search", {**Q6, "n_ubatch": ub}, [1.70 + i / 100] * 3, None) for i, ub in enumerate((512, 256, 128, 64))]
        + [("search", Q8, [1.85, 1.85, 1.85], None),                                       # within 10%: confirmed
           ("search", {**Q6, "quant": "F16"}, [2.5, 2.5, 2.5], None)]))                   # 32% slower: not
    cands = [replace(c, wall_s=8.0) for c in cands]
    order = [c.config_key for c in remeasure.to_remeasure(cands, TuneOptions(budget_s=600))]
    q6_best = key({**Q6, "n_ubatch": 512})
    # The rival of other weights that came close comes before the baseline: it could still be the best.
    assert order == [q6_best, key(Q8), key(BASE), key({**Q6, "n_ubatch": 256}), key({**Q6, "n_ubatch": 128})]
    # Every wanted config fits (trials planned at 1.25 x 8 s = 10 s): four rounds in 200 s, alternating order.
    trials = remeasure.schedule(cands, TuneOptions(budget_s=600), 200.0)
    assert len(trials) == 20 and [c.config_key for c in trials[5:10]] == order[::-1] == [c.config_key for c in trials[15:]]
    assert len(remeasure.schedule(cands, TuneOptions(budget_s=600), 150.0)) == 15  # three rounds at least


def slow_trials(wall_s: float, baseline_s: float) -> list[select.Candidate]:
    """The baseline, Q8_0 and Q6_K 1.8% behind it, each trial taking ``wall_s`` (the baseline's ``baseline_s``)."""
    cands = select.candidates(study_of([("baseline", BASE, [3.5, 3.6, 3.4], None),
                                        ("search", Q8, [2.80, 2.80, 2.80], None),
                                        ("search", Q6, [2.85, 2.85, 2.85], None)]))
    return [replace(c, wall_s=baseline_s if c.config_key == key(BASE) else wall_s) for c in cands]


def test_a_busy_machine_keeps_room_to_confirm_the_winner_against_its_rival_not_the_winner_alone() -> None:
    # Issue 25, 10 minutes on a busy Intel VM: trials took 30 s, so 30% of the budget (180 s) bought three
    # rounds of the winner (Q8_0) alone, and Q6_K, 3.4% faster on a quiet machine, was never compared with it.
    cands = slow_trials(30.0, baseline_s=36.0)
    options = TuneOptions(budget_s=600)
    assert [c.config_key for c in remeasure.to_remeasure(cands, options)] == [key(Q8), key(Q6), key(BASE)]
    # Three rounds of the two at 1.25 x 30 s = 225 s: more than 30% of the budget, within 45%.
    assert remeasure.reserve_seconds(cands, options) == 3 * 2 * remeasure.ROUND_SAFETY * 30.0
    assert [c.config_key for c in remeasure.schedule(cands, options, 230.0)] == [key(Q8), key(Q6), key(Q6), key(Q8),
                                                                                key(Q8), key(Q6)]
    # On a quiet machine (trials of 10 s) the share stays 30%: it fits all three, four rounds and a deciding one.
    quiet = [replace(c, wall_s=c.wall_s / 3) for c in cands]
    assert remeasure.reserve_seconds(quiet, options) <= remeasure.MAX_RESERVE_SHARE * 600
    # Where three rounds of two do not fit in 45% either (400 s: 180 s), two rounds of the two do (150 s):
    # 30% would have kept three rounds of the winner alone (112.5 s), which compare nothing.
    assert remeasure.reserve_seconds(cands, TuneOptions(budget_s=400)) == 2 * 2 * remeasure.ROUND_SAFETY * 30.0


def test_where_three_rounds_fit_only_the_winner_two_rounds_compare_it_with_its_rival() -> None:
    # Issue 25, grid.py --noise, 10 minutes, seed 0 on the busy Intel VM: Q8_0's trials took ~45 s, so three
    # rounds of Q8_0 and Q6_K (2 x 3 x 56 s = 337 s) did not fit in 45% of the budget (270 s) and the stage
    # confirmed Q8_0 alone: the pick stayed the search's, 5% behind Q6_K. Two rounds of the two (A B, B A) fit.
    cands = slow_trials(45.0, baseline_s=50.0)
    options = TuneOptions(budget_s=600)
    cost = remeasure.ROUND_SAFETY * 45.0
    assert remeasure.fit(cands, options, 270.0) == (remeasure.to_remeasure(cands, options)[:2], 2)
    reserve = remeasure.reserve_seconds(cands, options)
    assert reserve == 2 * 2 * cost
    assert [c.config_key for c in remeasure.schedule(cands, options, reserve)] == [key(Q8), key(Q6), key(Q6), key(Q8)]
    clock = {"left": reserve}
    ran: list[list[str]] = []

    def run_round(configs, number):
        ran.append([c.config_key for c in configs])
        clock["left"] -= 45.0 * len(configs)

    assert remeasure.run_stage(cands, options, lambda: clock["left"], run_round, lambda: cands) == (2, 2, 2)
    assert ran == [[key(Q8), key(Q6)], [key(Q6), key(Q8)]]
    # Where three rounds of two fit, they are run as before; where not even two rounds of two fit, there
    # is no stage (issue 41: three rounds of the winner alone compare nothing; that time is the search's),
    # unless one config is all the run asked for.
    assert remeasure.fit(cands, options, 6 * cost)[1] == remeasure.MIN_ROUNDS
    winner = next(c for c in cands if c.config_key == key(Q8))
    assert remeasure.fit(cands, options, 3.5 * cost) == ([], remeasure.MIN_ROUNDS)
    assert remeasure.schedule(cands, options, 3.5 * cost) == []
    assert remeasure.fit(cands, replace(options, remeasure=1), 3.5 * cost) == ([winner], remeasure.MIN_ROUNDS)


def test_the_search_stops_for_the_stage_only_while_the_stage_fits() -> None:
    from tuner.search.stages import search_on as _search_on

    # Trials of 8 s, planned at 10 s: two minutes keep 40 s back for two rounds of the winner and its
    # baseline (three rounds of both do not fit in 45%, 54 s); with 30 s left only three rounds of the winner
    # alone would fit, which compare nothing (issue 41): the rest is search time.
    study = study_of([("baseline", BASE, [3.5, 3.6, 3.4], None), ("search", Q8, [1.9, 1.9, 1.9], None)])
    options = TuneOptions(budget_s=120)
    assert remeasure.reserve_seconds(select.candidates(study), options) == 40.0
    assert _search_on(study, options, 100.0)
    assert not _search_on(study, options, 45.0)   # a search trial would eat into the reserve: the stage runs
    assert _search_on(study, options, 30.0)       # the stage of two no longer fits: the rest is search time
    assert _search_on(study, options, 20.0)
    assert not _search_on(study, options, 0.0)


def test_only_complete_rounds_of_the_stage_decide() -> None:
    # Round 1 of the stage was cut after Q6_K (the deadline): Q6_K's lucky figure of that round would make
    # it win on 2 rounds against Q8_0's 1; only the complete round 0 counts, so both are judged on it.
    study = optuna.create_study(direction="minimize")
    for role, settings, seconds, round_no in [("baseline", BASE, [3.5, 3.6, 3.4], None),
                                              ("remeasure", Q8, [1.90, 1.91, 1.92], 0),
                                              ("remeasure", Q6, [2.00, 2.01, 2.02], 0),
                                              ("remeasure", BASE, [3.5, 3.5, 3.6], 0),
                                              ("remeasure", Q6, [1.60, 1.61, 1.62], 1)]:
        attrs = {R.RECORD_ATTR: _record(role, settings, seconds).public()}
        if round_no is not None:
            attrs.update({select.CONFIRM_ATTR: "run-1", select.ROUND_ATTR: round_no})
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=min(seconds), user_attrs=attrs))
    assert select.complete_rounds(study, "run-1") == {0}
    cands = {c.config_key: c for c in select.candidates(study)}
    assert cands[key(Q6)].request.n == 3 and cands[key(Q6)].confirmed
    assert decision.best(list(cands.values()), "request_time").config_key == key(Q8)


def test_the_stage_runs_only_rounds_that_fit_and_every_config_gets_the_same_count() -> None:
    cands = [replace(c, wall_s=10.0) for c in select.candidates(study_of(
        [("baseline", BASE, [3.5, 3.6, 3.4], None), ("search", Q8, [1.9, 1.9, 1.9], None),
         ("search", Q6, [1.95, 1.96, 1.97], None)]))]
    clock = {"left": 100.0}
    ran: list[tuple[int, list[str]]] = []

    def run_round(configs, number):
        ran.append((number, [c.config_key for c in configs]))
        clock["left"] -= 10.0 * len(configs) * 2.0   # each trial twice its typical time (a busy machine)

    configs, rounds, planned = remeasure.run_stage(cands, TuneOptions(budget_s=600), lambda: clock["left"],
                                                   run_round, lambda: cands)
    # Trials of 10 s planned at 12.5 s: three rounds of two configs fit in 100 s (75 s), a third config's
    # 37.5 s more do not. The trials take twice as long as planned: after two rounds 20 s are left, less
    # than a round's 25 s, so the third round is not started (it would end past the deadline).
    assert (configs, planned) == (2, 3) and rounds == 2 and [n for n, _ in ran] == [0, 1]
    assert ran[1][1] == ran[0][1][::-1]     # alternating order
    assert all(sorted(keys) == sorted(ran[0][1]) for _, keys in ran)


def test_an_undecided_winner_gets_more_rounds_when_they_fit() -> None:
    cands = [replace(c, wall_s=5.0) for c in select.candidates(study_of(
        [("baseline", BASE, [3.5, 3.6, 3.4], None), ("search", Q8, [1.9, 2.3, 1.95], None),
         ("search", Q6, [2.05, 2.0, 2.6], None)]))]
    ran = []
    configs, rounds, planned = remeasure.run_stage(cands, TuneOptions(budget_s=600), lambda: 1000.0,
                                                   lambda configs, number: ran.append(number), lambda: cands)
    assert decision.undecided(cands, "request_time")
    assert rounds == planned + remeasure.MAX_EXTRA_ROUNDS and ran == list(range(rounds))


def test_a_deciding_round_measures_only_the_winner_and_its_undecided_rival() -> None:
    # Q8_0 and Q6_K cannot be told apart on these figures (wide spread, 8% apart); the baseline is far
    # slower. After the planned rounds only the two are measured again, and only while undecided.
    cands = [replace(c, wall_s=5.0) for c in select.candidates(study_of(
        [("baseline", BASE, [3.5, 3.6, 3.4], None), ("search", Q8, [1.9, 2.3, 1.95], None),
         ("search", Q6, [2.05, 2.0, 2.6], None)]))]
    ran: list[list[str]] = []
    decided = {"after": 2}   # the figures decide after two deciding rounds

    def measured():
        return cands if len(ran) < remeasure.MAX_ROUNDS + decided["after"] else \
            [c for c in cands if c.config_key != key(Q6)]

    configs, rounds, planned = remeasure.run_stage(cands, TuneOptions(budget_s=600), lambda: 1000.0,
                                                   lambda configs, number: ran.append([c.config_key for c in configs]),
                                                   measured)
    assert (configs, planned) == (3, remeasure.MAX_ROUNDS) and rounds == planned + 2
    assert all(len(r) == 3 for r in ran[:planned])
    assert [sorted(r) for r in ran[planned:]] == [sorted([key(Q8), key(Q6)])] * 2
    assert ran[planned] == ran[planned + 1][::-1]


def test_a_deciding_round_counts_as_complete_and_an_unfinished_one_does_not() -> None:
    # Rounds 0-2 measured all three configs; round 3 (deciding, size 2) measured Q8_0 and Q6_K; round 4
    # (deciding) was cut after Q6_K: its lucky figure does not count.
    study = optuna.create_study(direction="minimize")
    rows = [(s, r, 3) for r in range(3) for s in (Q8, Q6, BASE)] + [(Q8, 3, 2), (Q6, 3, 2), (Q6, 4, 2)]
    for settings, round_no, size in rows:
        seconds = [1.0, 1.0, 1.0] if (settings is Q6 and round_no == 4) else [2.0, 2.0, 2.0]
        attrs = {R.RECORD_ATTR: _record("remeasure", settings, seconds).public(), select.CONFIRM_ATTR: "run-1",
                 select.ROUND_ATTR: round_no, select.ROUND_SIZE_ATTR: size}
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=min(seconds), user_attrs=attrs))
    assert select.complete_rounds(study, "run-1") == {0, 1, 2, 3}
    cands = {c.config_key: c for c in select.candidates(study)}
    assert cands[key(Q6)].request.n == 12 and cands[key(Q8)].request.n == 12 and cands[key(BASE)].request.n == 9
    assert cands[key(Q6)].request.median == 2.0   # round 4's 1.0 s left out


def test_the_reserve_keeps_room_for_one_deciding_round_where_it_fits() -> None:
    cands = [replace(c, wall_s=8.0) for c in select.candidates(study_of(
        [("baseline", BASE, [3.5, 3.6, 3.4], None), ("search", Q8, [1.9, 1.9, 1.9], None),
         ("search", Q6, [1.95, 1.96, 1.97], None)]))]
    options = TuneOptions(budget_s=600)
    stage = sum(remeasure.trial_cost(c) for c in remeasure.schedule(cands, options, remeasure.MAX_RESERVE_SHARE * 600))
    assert remeasure.reserve_seconds(cands, options) == stage + remeasure.ROUND_SAFETY * 16.0


def test_every_side_by_side_measurement_orders_its_rounds_alike() -> None:
    from tuner.measure.rounds import interleaved, round_order

    assert list(interleaved("ABC", 3)) == [(0, "A"), (0, "B"), (0, "C"), (1, "C"), (1, "B"), (1, "A"),
                                           (2, "A"), (2, "B"), (2, "C")]
    assert round_order("AB", 1) == ["B", "A"] and round_order("AB", 2) == ["A", "B"]


def test_a_re_measure_is_priced_at_the_repetitions_it_runs_not_those_a_search_trial_stopped_at() -> None:
    # Search trials stop at two repetitions when they agree; a re-measure runs the three asked. Priced at the
    # search trials' wall time, a 5-minute Intel run kept room for 3 rounds and fitted 2.
    study = optuna.create_study(direction="minimize")
    for seconds, timed in (([2.8, 2.8], 5.6), ([2.9, 2.9], 5.8)):   # 8 s of wall, 2 repetitions of ~2.85 s
        rec = replace(_record("search", Q8, seconds), extra={"timed_s": timed})
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=2.8, user_attrs={R.RECORD_ATTR: rec.public()}))
    (cand,) = select.candidates(study)
    assert (cand.wall_s, cand.reps) == (8.0, 2) and abs(cand.rep_s - 2.85) < 1e-9
    assert abs(cand.trial_s(3) - 10.85) < 1e-9 and cand.trial_s(2) == cand.trial_s(1) == 8.0
    assert abs(remeasure.trial_cost(cand, 3) - remeasure.ROUND_SAFETY * 10.85) < 1e-9
    # The reserve for three rounds of it (a 2-minute budget's 36 s cannot hold them at 3 repetitions) keeps
    # nothing back, where the search trials' 8 s would have kept 30 s for rounds that do not fit (asked to
    # confirm one config: a stage of one config alone compares nothing and is run only when asked for).
    one = TuneOptions(budget_s=120, repetitions=3, remeasure=1)
    assert remeasure.reserve_seconds([cand], one) == 0.0
    assert remeasure.reserve_seconds([cand], replace(one, repetitions=2)) == 30.0
