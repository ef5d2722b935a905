"""The one decision rule (tuner.selection.decision): an outlier repetition cannot win a config the pick, a tie needs
both "not significantly different" and "inside 3%", and only a true tie goes to the config that changes
fewer settings."""

from __future__ import annotations

import math

from tuner.selection import decision, candidates as select
from tuner.measure.records import Stat

PROMPT, GENERATED = 512, 128


def cand(key: str, seconds: list[float], roles: tuple[str, ...] = ("search",), **settings) -> select.Candidate:
    """A pooled config whose repetitions took ``seconds`` per request (prefill and decode in step)."""
    return select.Candidate(
        config_key=key, settings={"backend": "llama_cpp", **settings}, trials=(0,), roles=roles,
        prefill=Stat.of([PROMPT / (s * 0.4) for s in seconds]), decode=Stat.of([GENERATED / (s * 0.6) for s in seconds]),
        ttft=Stat.of([s * 0.4 for s in seconds]), peak_rss=100, request=Stat.of(seconds))


BASE = dict(quant="source", n_threads=1, flash_attn=False)


def test_a_noisy_config_does_not_win_by_tie() -> None:
    # The run: one 6.4 s repetition gave F16 a 38% spread; it tied with everything and won.
    f16 = cand("F16 fa off", [3.3, 3.4, 6.4], quant="F16", n_threads=2, flash_attn=False)
    q8 = cand("Q8_0 fa off", [2.74, 2.76, 2.78], quant="Q8_0", n_threads=2, flash_attn=False)
    q6 = cand("Q6_K fa off", [2.57, 2.58, 2.60], quant="Q6_K", n_threads=2, flash_attn=False)
    base = cand("defaults", [3.5, 3.6, 3.55], roles=("baseline",), **BASE)
    chosen = decision.best([f16, q8, q6, base], "request_time")
    assert chosen is q6
    assert decision.best([f16, q8, base], "request_time") is q8
    # The outlier does not widen anything: F16 is significantly slower than Q8_0, not tied with it.
    seen = decision.compare(f16, q8, "request_time")
    assert seen.verdict == decision.WORSE and seen.ratio < 0.85
    # And F16 never wins, whatever else is measured beside it.
    for others in ([f16, q8], [f16, q6], [f16, q8, q6]):
        assert decision.best(others, "request_time") is not f16


def test_truly_equal_configs_tie_toward_fewer_changed_settings() -> None:
    samples = [2.99, 3.0, 3.01]  # the whole interval of the shift inside 3%: a measured equivalence
    base = cand("defaults", samples, roles=("baseline",), **BASE)
    tuned = cand("tuned", samples, quant="Q8_0", n_threads=2, flash_attn=True)
    assert decision.compare(tuned, base, "request_time").verdict == decision.TIED
    assert decision.best([tuned, base], "request_time") is base
    one_change = cand("one change", samples, quant="source", n_threads=2, flash_attn=False)
    assert decision.best([tuned, one_change, base], "request_time") is base
    # Without the defaults among them, the one changing fewer settings from the measured baseline wins.
    base_elsewhere = cand("defaults", [1.0, 1.0, 1.0], roles=("baseline",), **BASE)
    assert decision.best([tuned, one_change, base_elsewhere], "request_time") is base_elsewhere
    assert decision.best([tuned, one_change, base_elsewhere], "request_time", among=lambda c: c is not base_elsewhere) \
        is one_change


def test_a_small_consistent_difference_is_not_a_tie() -> None:
    # 2% apart, every repetition of one faster than every repetition of the other: significant.
    base = cand("defaults", [3.06, 3.06, 3.07], roles=("baseline",), **BASE)
    tuned = cand("tuned", [3.00, 3.00, 3.01], quant="Q8_0", n_threads=2)
    assert decision.compare(tuned, base, "request_time").verdict == decision.BETTER
    assert decision.best([tuned, base], "request_time") is tuned


def test_too_wide_to_decide_is_undecided_not_tied() -> None:
    top = cand("top", [2.0, 2.6, 2.1], quant="Q8_0", n_threads=2)
    rival = cand("rival", [2.2, 2.15, 2.9], quant="Q6_K", n_threads=2)
    base = cand("defaults", [4.0, 4.1, 4.05], roles=("baseline",), **BASE)
    seen = decision.compare(rival, top, "request_time")
    assert seen.verdict == decision.UNDECIDED and not seen.significant
    assert decision.best([top, rival, base], "request_time") is top   # by median, not by tie
    assert decision.undecided([top, rival, base], "request_time") == [rival]


def test_the_interval_is_the_exact_mann_whitney_one() -> None:
    # Three against three: 90% is the widest interval there is (P(U=0) = 1/20 on each side).
    assert decision._rank_cut(3, 3) == 1
    assert decision._rank_cut(1, 3) == 0                 # one sample: nothing can be significant
    assert decision._rank_cut(6, 6) > decision._rank_cut(3, 3)
    lone = cand("lone", [2.0])
    other = cand("other", [2.5, 2.6, 2.4])
    seen = decision.compare(lone, other, "request_time")
    assert not seen.significant and math.isinf(seen.high)


def test_the_ceiling_keeps_a_config_over_it_from_being_recommended() -> None:
    fast = cand("fast", [2.0, 2.0, 2.1], quant="Q8_0")
    lean = cand("lean", [2.5, 2.5, 2.6], quant="Q4_0")
    fast = select.Candidate(**{**fast.__dict__, "peak_rss": 300})
    assert decision.best([fast, lean], "request_time") is fast
    assert decision.best([fast, lean], "request_time", ceiling=200) is lean
    assert decision.best([fast], "request_time", ceiling=200) is None


def test_every_objective_decides_on_its_own_samples() -> None:
    a = cand("a", [2.0, 2.01, 2.02], quant="Q8_0")
    b = cand("b", [2.5, 2.51, 2.52], quant="Q6_K")
    for objective in ("request_time", "balanced", "decode", "prefill", "pareto"):
        assert decision.best([a, b], objective) is a
    assert decision.picks([a, b])["fastest_decode"] is a


def test_the_recommendation_respects_the_runs_memory_ceiling() -> None:
    import optuna
    import pytest

    from tuner.errors import AutotuneError
    from tuner.recommend.query import StudyView

    study = optuna.create_study(study_name="ceiling")
    study.set_user_attr("objective", "request_time")
    fast = select.Candidate(**{**cand("fast", [2.0, 2.0, 2.1], quant="Q8_0").__dict__, "peak_rss": 205 << 20})
    lean = select.Candidate(**{**cand("lean", [2.5, 2.5, 2.6], quant="Q4_0").__dict__, "peak_rss": 150 << 20})
    view = StudyView(storage=None, study=study, profile=None, candidates=[fast, lean])  # type: ignore[arg-type]
    assert view.chosen() is fast
    assert view.chosen(ceiling=180 << 20) is lean
    view = StudyView(storage=None, study=study, profile=None, candidates=[fast])  # type: ignore[arg-type]
    with pytest.raises(AutotuneError) as caught:
        view.chosen(ceiling=180 << 20)
    line = str(caught.value)
    assert "\n" not in line and "180.0 MiB" in line and "205.0 MiB" in line and "Q8_0" in line


def test_too_few_samples_for_an_interval_is_undecided_never_a_tie() -> None:
    # The 2m grid's case (issue 41): Q8_0 with flash attention on was faster in its own trials, 2 samples
    # each; within 3%, the old rule called it a tie and gave it to fa off (the fewer change).
    base = cand("defaults", [6.0, 6.1], roles=("baseline",), **{**BASE, "quant": "Q8_0"})
    fa_on = cand("Q8_0 fa on", [5.21, 5.23], quant="Q8_0", n_threads=1, flash_attn=True)
    fa_off = cand("Q8_0 fa off", [5.33, 5.35], quant="Q8_0", n_threads=2, flash_attn=False)
    for a, b in ((fa_on, fa_off), (fa_off, fa_on)):
        seen = decision.compare(a, b, "request_time")
        assert seen.verdict == decision.UNDECIDED and math.isinf(seen.high) and seen.low == 0.0
    assert decision.best([fa_on, fa_off, base], "request_time") is fa_on  # by median
    assert fa_off in decision.undecided([fa_on, fa_off, base], "request_time")  # worth more rounds
    # 1 against n and 2 against 3 have no finite interval either.
    for left, right in (([5.21], [5.22, 5.23, 5.24]), ([5.21, 5.22], [5.22, 5.23, 5.24])):
        assert decision._rank_cut(len(left), len(right)) == 0
        assert decision.compare(cand("a", left), cand("b", right), "request_time").verdict == decision.UNDECIDED


def test_six_against_six_with_a_tight_interval_inside_the_margin_is_a_tie() -> None:
    a = cand("a", [3.00, 3.01, 3.02, 3.00, 3.01, 3.02], quant="Q8_0", n_threads=2)
    b = cand("b", [3.01, 3.02, 3.00, 3.02, 3.01, 3.03], **BASE)
    seen = decision.compare(a, b, "request_time")
    assert seen.verdict == decision.TIED and 1 / 1.03 <= seen.low <= seen.high <= 1.03
    # Six against six 2% apart with a spread that reaches past 3%: not shown equivalent, so undecided.
    wide = cand("wide", [2.80, 3.10, 2.95, 3.05, 2.85, 3.00], quant="Q6_K", n_threads=2)
    assert decision.compare(wide, b, "request_time").verdict == decision.UNDECIDED


def test_the_confirmation_gives_configs_without_an_interval_a_deciding_round() -> None:
    from tuner.search import remeasure

    fa_on = cand("fa on", [5.21, 5.23], quant="Q8_0", flash_attn=True)
    fa_off = cand("fa off", [5.33, 5.35], quant="Q8_0", flash_attn=False)
    deciding = remeasure.deciding_round([fa_on, fa_off], [fa_on, fa_off], "request_time")
    assert {c.config_key for c in deciding} == {"fa on", "fa off"}
