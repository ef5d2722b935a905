"""The serve workload (issue 43): several users on llama-server, judged by goodput against latency targets.

The figures' arithmetic is checked on hand-made request results; the rest runs the real llama-server (built
once per llama.cpp version by ``autotune build-server``, which .ci/run runs first) and a real streaming client.
"""

from __future__ import annotations


import dataclasses

import pytest

from tuner.config import objectives
from tuner.config.workloads import get_workload
from tuner.errors import AutotuneError
from tuner.measure import serving_figures as F
from tuner.measure.serving_client import RequestResult
from tuner.search import serving
from tuner.search.options import TuneOptions


def request(ttft: float | None, total: float, tokens: int, error: str = "") -> RequestResult:
    return RequestResult(user=0, started_s=0.0, ttft_s=ttft, total_s=total, output_tokens=tokens,
                         prompt_tokens=100, error=error)


def test_goodput_counts_only_the_tokens_of_requests_that_met_both_targets() -> None:
    results = [request(0.5, 0.5 + 63 * 0.05, 64),   # in time, 50 ms per token: counts
               request(2.0, 2.0 + 63 * 0.05, 64),   # first token too late
               request(0.5, 0.5 + 63 * 0.2, 64),    # too slow per token
               request(None, 30.0, 0, error="ReadTimeout")]
    figures = F.window_figures(results, 10.0, users=4, max_ttft_s=1.0, max_tpot_s=0.1)
    assert figures["goodput_tps"] == pytest.approx(6.4)
    assert figures["output_tps"] == pytest.approx(19.2)
    assert (figures["completed"], figures["failed"], figures["met_targets"]) == (3, 1, 1)
    assert figures["errors"] == ["ReadTimeout"]
    assert figures["tpot_p50_s"] == pytest.approx(0.05)
    assert figures["ttft_p90_s"] == pytest.approx(1.7)


def test_capacity_is_the_most_users_up_to_the_first_count_that_missed_the_targets() -> None:
    def at(users: int, ttft: float, tpot: float = 0.05) -> dict:
        return {"users": users, "ttft_p90_s": ttft, "tpot_p90_s": tpot, "failed": 0}

    assert F.capacity([at(1, 0.1), at(2, 0.2), at(4, 0.9), at(8, 3.0)], 1.0, 0.1) == 4
    assert F.capacity([at(1, 0.1), at(2, 2.0), at(4, 0.5)], 1.0, 0.1) == 1  # not past the first miss
    assert F.capacity([at(1, 0.1, tpot=0.3)], 1.0, 0.1) == 0
    assert F.capacity([{**at(1, 0.1), "failed": 1}], 1.0, 0.1) == 0


def test_percentile_interpolates_and_summary_takes_medians() -> None:
    assert F.percentile([], 0.9) is None
    assert F.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.9) == pytest.approx(4.6)
    windows = [F.window_figures([request(0.2, 1.0, 10)], 2.0, 1, 1.0, 0.1),
               F.window_figures([request(0.4, 1.0, 10)], 4.0, 1, 1.0, 0.1),
               F.window_figures([request(None, 1.0, 0, error="x")], 1.0, 1, 1.0, 0.1)]
    summary = F.summary(windows)
    assert summary["windows"] == 3 and summary["ttft_p50_s"] == pytest.approx(0.3)  # the one with none left out
    assert summary["errors"] == ["x"]


def test_the_serve_workload_ranks_by_goodput_in_its_own_space() -> None:
    options = serving.resolve_options(TuneOptions(workload="serve"))
    assert options.objective == "goodput" and options.space.endswith("serve.yaml")
    assert serving.resolve_options(TuneOptions(workload="serve", objective="decode")).objective == "decode"
    assert serving.resolve_options(TuneOptions()).objective == objectives.DEFAULT
    assert serving.resolve_options(TuneOptions()).space is None
    workload = get_workload("serve")
    assert workload.kind == "serve" and workload.needed_ctx() == workload.users * workload.request_ctx()
    assert "users" in workload.public() and "users" not in get_workload("default").public()


def test_users_and_targets_name_another_study_and_are_refused_for_other_workloads() -> None:
    serve = get_workload("serve")
    assert serving.with_users(serve, None) is serve and serving.with_users(serve, serve.users) is serve
    more = serving.with_users(serve, 16, max_ttft_s=0.5)
    assert (more.users, more.max_ttft_s, more.name) == (16, 0.5, "serve@16users@ttft0.5s")
    assert more.needed_ctx() == 2 * serve.needed_ctx()
    with pytest.raises(AutotuneError, match="--users, --max-ttft and --max-tpot are for a serve workload"):
        serving.with_users(get_workload("default"), 4)


def test_targets_no_config_met_end_in_one_line_naming_the_closest() -> None:
    from tuner.measure.records import Stat
    from tuner.selection.candidates import Candidate

    def cand(ttft: float, goodput: float) -> Candidate:
        return Candidate(config_key=str(ttft), settings={"quant": "F16", "n_parallel": 8}, trials=(0,), roles=(),
                         prefill=Stat.of([1.0]), decode=Stat.of([1.0]), ttft=Stat.of([ttft]), peak_rss=1,
                         goodput=Stat.of([goodput]), extra={"serving": {"ttft_p90_s": ttft, "tpot_p90_s": 0.08}})

    serve = get_workload("serve")
    serving.check_targets_met([cand(1.5, 1.0), cand(3.0, 0.0)], serve)  # one served in time: fine
    with pytest.raises(AutotuneError) as caught:
        serving.check_targets_met([cand(3.0, 0.0), cand(1.5, 0.0)], serve)
    message = str(caught.value)
    assert "\n" not in message and "no config met the targets for 8 users" in message
    assert "p90 time to first token 1.50 s" in message and "n_parallel=8" in message


def test_a_backend_without_a_server_for_several_users_is_refused() -> None:
    from tuner import backends

    with pytest.raises(AutotuneError, match="cannot serve several users"):
        backends.get("transformers").serving_engine(print)


def test_llama_server_defaults_are_its_automatic_slots() -> None:
    from tuner.backends.settings import defaults

    base = defaults("llama_cpp", 2, get_workload("serve").needed_ctx(), serving=True)
    assert (base.n_parallel, base.kv_unified, base.flash_attn, base.n_batch) == (4, True, True, 2048)
    assert base.n_ctx >= get_workload("serve").needed_ctx()
    single = defaults("llama_cpp", 2, 640)
    assert (single.n_parallel, single.kv_unified) == (1, False)


def test_slot_counts_above_the_users_are_left_out_of_the_space() -> None:
    from tuner.search.space import load_space

    workload = serving.with_users(get_workload("serve"), 2)
    resolved = load_space(str(serving.SERVE_SPACE)).resolve(2, workload.needed_ctx(), 8192, workload.prefill_tokens(),
                                                            ("gguf",))
    fitted = serving.fit_space(resolved, workload)
    assert fitted.distributions["n_parallel"].choices == (1, 2)
    assert any("n_parallel 4, 8 left out" in note for note in fitted.notes)
    assert serving.fit_space(resolved, get_workload("serve")) is resolved


def test_a_window_counts_the_tokens_that_arrived_in_it_and_judges_every_request_under_way() -> None:
    early = dataclasses.replace(request(0.5, 2.0, 4), started_s=-1.0, token_times=(-0.5, 0.2, 0.6, 0.9))
    inside = dataclasses.replace(request(0.2, 3.0, 3), started_s=1.0, token_times=(1.2, 2.0, 4.0))
    late_first = dataclasses.replace(request(1.5, 2.0, 2), started_s=2.0, token_times=(2.5, 3.9))
    figures = F.window_figures([early, inside, late_first], (0.0, 3.0), 2, max_ttft_s=1.0, max_tpot_s=10.0)
    assert figures["output_tps"] == pytest.approx((3 + 2 + 1) / 3.0)  # arrivals in [0, 3) only
    assert figures["goodput_tps"] == pytest.approx((3 + 2) / 3.0)     # late_first missed its TTFT target
    assert (figures["requests"], figures["met_targets"]) == (2, 1)    # latencies: the requests started in it
