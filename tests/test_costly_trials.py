"""Where one request costs a large share of the budget (issue 44: a 3072-token prompt on 2 vCPUs, ~30 s at
llama.cpp's defaults; a 1.5B model): a trial keeps fewer timed repetitions (at least one), its warmup does not
redo the whole prompt, a disturbed repetition is replaced only where another fits, and the confirmation
stage is planned at the repetitions its trials will keep, so a 4-minute run still confirms its winner."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from tuner.backends import protocol
from tuner.measure import disturbance
from tuner.search import remeasure
from tuner.search.repetitions import MIN_TIMED_S, planned, timed_cap_s
from tuner.search.tune import TuneOptions
from tuner.selection import candidates as select

from test_confirm import BASE, Q6, Q8, key, study_of


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """The protocol's clock, moved on by the fake engine below; no wait for a quiet machine."""
    now = {"t": 0.0}
    monkeypatch.setattr(protocol, "time", SimpleNamespace(monotonic=lambda: now["t"]))
    monkeypatch.setattr(disturbance, "wait_left", lambda *_: 0.0)
    protocol._watched.clear()
    yield now
    protocol.cap_timed(None)
    protocol._watched.clear()


def _reps(now: dict[str, float], cap: float | None, request_s: float, asked: int = 3,
          tokens: int = 3072) -> tuple[dict, list[int]]:
    """The single-prompt protocol on a fake engine whose prefill of a 3072-token prompt takes ``request_s``
    (a shorter one takes its share): (result, the token counts each prefill saw)."""
    seen: list[int] = []

    def prefill(toks: list[int]) -> tuple[float, int]:
        seen.append(len(toks))
        now["t"] += request_s * len(toks) / tokens
        return request_s * len(toks) / tokens, 1

    protocol.cap_timed(cap)
    result = protocol.prefill_decode_reps(lambda: None, prefill, lambda first, n: (0.001, None), list(range(tokens)),
                                          8, asked, True)
    return result, seen


def test_a_costly_request_is_repeated_less_and_warmed_up_on_a_short_prefix(clock: dict[str, float]) -> None:
    # The 4-minute long-prompt run: 30 s per request, a cap of 12 s: one timed repetition, not three.
    result, seen = _reps(clock, timed_cap_s(240), 30.0)
    assert len(result["request_s"]) == 1 and seen == [protocol.WARMUP_PREFILL, 3072]
    # Two fit a cap of 25 s at 10 s each; no cap: the three asked, however long.
    assert len(_reps(clock, 25.0, 10.0)[0]["request_s"]) == 2
    assert len(_reps(clock, None, 30.0)[0]["request_s"]) == 3
    # A short prompt is warmed up whole, as before (the default workload's 512 tokens).
    assert _reps(clock, None, 1.0, tokens=300)[1][0] == 300


def test_a_disturbed_repetition_is_replaced_only_where_another_fits_the_cap(clock: dict[str, float],
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    class Busy:  # every repetition disturbed (the 4-minute run on a busy machine replaced two of 36 and 82 s)
        def start(self, waited: float = 0.0) -> None:
            pass

        def phase(self, name: str) -> None:
            pass

        def stop(self, request_phases: tuple[str, ...] = ()) -> dict:
            return {"wall_s": 1.0, "other_cpu_s": 1.0, "disturbed": True}

    monkeypatch.setattr(protocol, "_watch", Busy())
    result, _ = _reps(clock, 12.0, 30.0)
    assert len(result["request_s"]) == 1 and [d["replaced"] for d in protocol.watched()] == [False]
    protocol._watched.clear()
    result, _ = _reps(clock, 100.0, 10.0)  # cheap enough: replaced (at most MAX_REPEATS), then three kept
    assert len(result["request_s"]) == 3
    assert sum(d["replaced"] for d in protocol.watched()) == disturbance.MAX_REPEATS


def test_the_repetitions_a_trial_keeps_follow_the_cost_of_one() -> None:
    assert timed_cap_s(240) == 12.0 and timed_cap_s(60) == MIN_TIMED_S and timed_cap_s(1800) == 90.0
    assert planned(3, 30.0, 240) == 1 and planned(3, 5.0, 240) == 2 and planned(3, 3.0, 240) == 3
    assert planned(3, 25.0, 1800) == 3 and planned(3, 0.0, 240) == 3 and planned(3, 30.0, None) == 3
    assert planned(3, 3.5, 120) == 2  # the bundled model's defaults in a 2-minute run: two of 3.5 s fit 10 s


def test_a_four_minute_long_prompt_run_keeps_room_to_confirm_its_winner_against_a_rival() -> None:
    # Trials as the capped runs measure them: one timed repetition each (Q8_0 ~10 s, Q6_K ~11 s, the
    # defaults ~30 s), plus loading and a short warmup. Priced at the three repetitions asked, the
    # stage did not fit in 45% of 4 minutes and the run confirmed nothing.
    study = study_of([("baseline", BASE, [30.0], None), ("search", Q8, [10.0], None), ("search", Q6, [11.0], None)])
    costs = {key(BASE): (36.0, 30.0), key(Q8): (14.0, 10.0), key(Q6): (15.0, 11.0)}
    cands = [replace(c, wall_s=costs[c.config_key][0], reps=1, rep_s=costs[c.config_key][1])
             for c in select.candidates(study)]
    options = TuneOptions(budget_s=240)
    assert remeasure.trial_cost(cands[1], 3) > remeasure.trial_cost(cands[1], 3, 240) == remeasure.ROUND_SAFETY * 14.0
    reserve = remeasure.reserve_seconds(cands, options)
    assert 0 < reserve <= remeasure.PAIR_RESERVE_SHARE * 240
    stage = remeasure.schedule(cands, options, reserve)
    assert {c.config_key for c in stage} == {key(Q8), key(Q6)} and len(stage) >= 4
    # The old price (three repetitions each): nothing fits, no reserve, no confirmation.
    uncapped = [replace(c, reps=1) for c in cands]
    assert remeasure.fit(uncapped, replace(options, budget_s=10**9), remeasure.PAIR_RESERVE_SHARE * 240)[0] == []


def test_a_one_off_setup_is_not_priced_into_the_re_measures() -> None:
    # The first transformers trial of a GGUF file dequantizes it (17-20 s on a 2-vCPU EPYC) and keeps the copy
    # every later trial loads in 0.3 s: its re-measure costs its wall time less that (``once_s``).
    import optuna
    from optuna.trial import TrialState, create_trial

    from test_confirm import _record
    from tuner.measure import records as R

    study = optuna.create_study(direction="minimize")
    rec = replace(_record("baseline", BASE, [15.0]), extra={"once_s": 5.0})
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=15.0, user_attrs={R.RECORD_ATTR: rec.public()}))
    (cand,) = select.candidates(study)
    assert rec.outcome.wall_s == 8.0 and cand.wall_s == 3.0
