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
    workload = get_workload("serve")
    options = serving.resolve_options(TuneOptions(workload="serve"))
    assert options.space.endswith("serve.yaml") and serving.resolve_options(options, workload).objective == "goodput"
    assert serving.resolve_options(TuneOptions(objective="decode"), workload).objective == "decode"
    assert serving.resolve_options(TuneOptions(), get_workload("default")).objective == objectives.DEFAULT
    assert serving.resolve_options(TuneOptions()).space is None
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


# --- the real llama-server, a real client ---------------------------------------------------------------

SERVE_SPACE = """\
version: 1
description: a tiny serving space for the tests
workloads:
  serve-tiny:
    kind: serve
    users: 2
    prompt_tokens: 64
    generate_tokens: 8
    duration_s: 1.5
params:
  n_parallel: {choices: [1, 2]}
  n_threads: {choices: [1]}
  n_threads_batch: {choices: [1]}
  n_ctx: {choices: [1024]}
"""


@pytest.fixture
def llama_server() -> str:
    """The cached llama-server (``autotune build-server``; .ci/run builds it before the tests)."""
    import os

    from tuner.backends.llama_cpp.server_binary import find_llama_server

    try:
        return str(find_llama_server(build=bool(os.environ.get("AUTOTUNE_BUILD_SERVER_IN_TESTS"))).path)
    except AutotuneError as exc:
        pytest.skip(f"{exc} (.ci/run builds it before the tests)")


def serve_args(tmp_path, *extra: str) -> list[str]:
    space = tmp_path / "serve.yaml"
    space.write_text(SERVE_SPACE)
    return ["run", "--workload", "serve-tiny", "--space", str(space), "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}",
            "--max-quality-loss", "none", "--max-kl", "none", "--repetitions", "1", "--trial-timeout", "60s",
            "-o", str(tmp_path / "rec.yaml"), *extra]


@pytest.mark.slow
def test_a_serve_trial_takes_its_figures_from_streamed_responses(llama_server: str, tmp_path) -> None:
    from tuner.backends.settings import defaults
    from tuner.config.model import resolve_model
    from tuner.measure.runner import run_child
    from tuner.measure.spec import TrialSpec

    workload = get_workload("serve").model_copy(update={"users": 2, "prompt_tokens": 64, "generate_tokens": 8,
                                                        "duration_s": 1.5})
    settings = defaults("llama_cpp", 1, workload.needed_ctx(), serving=True).model_copy(
        update={"n_parallel": 2, "n_threads": 1, "n_threads_batch": 1})
    outcome = run_child(TrialSpec.of(resolve_model(None).path, settings, workload, 2, capacity=True),
                        timeout_s=120, memory_ceiling=None)
    assert outcome.ok, outcome.reason + outcome.stderr_tail
    result = outcome.result
    serving_summary = result["serving"]
    assert serving_summary["completed"] >= 2 and serving_summary["failed"] == 0
    assert 0 < serving_summary["ttft_p50_s"] < serving_summary["request_p50_s"]
    assert len(result["goodput_tps"]) == len(result["decode_tps"]) == 2
    assert all(w["output_tps"] > 0 for w in result["serving_windows"])
    assert result["capacity"]["sweep"][0]["users"] == 1
    assert outcome.memory.peak_rss > 50 * 2**20  # the server's memory (weights, KV) counts


@pytest.mark.slow
def test_a_killed_serve_run_leaves_no_server_and_unmet_targets_give_one_line(llama_server: str, tmp_path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    def servers_of(pid: int) -> list[psutil.Process]:
        try:
            return [p for p in psutil.Process(pid).children(recursive=True) if "llama-server" in p.name()]
        except psutil.Error:
            return []

    command = [sys.executable, "-c", "from tuner.cli import main; main()"]
    proc = subprocess.Popen([*command, *serve_args(tmp_path, "--budget", "3m")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (started := servers_of(proc.pid)) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert started, "no llama-server started within 2 minutes"
    os.kill(proc.pid, signal.SIGKILL)  # no handler runs: the kernel ends the trial's child, and it the server
    proc.wait()
    deadline = time.monotonic() + 15
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], \
        "a llama-server outlived its killed run"

    # A target nobody meets: the run ends with one line naming the closest config (the study resumes).
    done = subprocess.run([*command, *serve_args(tmp_path, "--budget", "40s", "--max-ttft", "1ms")],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "no config met the targets for 2 users" in last and "p90 time to first token" in last, done.stderr
    assert "Traceback" not in done.stderr


def test_goodput_ties_are_broken_by_p90_latency() -> None:
    from tuner.measure.records import Stat
    from tuner.selection import decision
    from tuner.selection.candidates import Candidate

    def cand(key: str, ttft: float, goodput: list[float]) -> Candidate:
        return Candidate(config_key=key, settings={"backend": "llama_cpp", "n_parallel": 8}, trials=(0,),
                         roles=("search",), prefill=Stat.of([1.0]), decode=Stat.of([1.0]), ttft=Stat.of([ttft] * 6),
                         peak_rss=1, goodput=Stat.of(goodput), confirmed=True)

    same = [100.0, 100.2, 99.9, 100.1, 100.0, 99.8]
    slow, fast = cand("slow", 0.8, same), cand("fast", 0.3, [g - 0.05 for g in same])
    assert decision.compare(slow, fast, "goodput").verdict == decision.TIED
    assert decision.best([slow, fast], "goodput").config_key == "fast"


@pytest.mark.slow
def test_a_serve_run_recommends_a_server_with_its_goodput_command_and_capacity_curve(llama_server: str,
                                                                                    tmp_path) -> None:
    """A single-request run first, then a serve run in the same database: the serve pick comes with its
    goodput, command and capacity, against llama-server's defaults and the single-request pick, both served
    and swept the same way."""
    from click.testing import CliRunner

    from conftest import TINY_SPACE
    from tuner.cli import cli
    from tuner.recommend.document import load

    runner = CliRunner()
    (tmp_path / "tiny.yaml").write_text(TINY_SPACE)
    single = runner.invoke(cli, ["run", "--workload", "tiny", "--space", str(tmp_path / "tiny.yaml"), "--storage",
                                 f"sqlite:///{tmp_path / 'db.sqlite'}", "--budget", "20s", "--repetitions", "1",
                                 "--max-quality-loss", "none", "-o", str(tmp_path / "single.yaml")])
    assert single.exit_code == 0, single.output
    done = runner.invoke(cli, serve_args(tmp_path, "--budget", "90s", "--trial-timeout", "120s"))
    assert done.exit_code == 0, done.output
    assert "goodput tok/s (2 users)" in done.output and "Serve it as measured" in done.output
    assert "Against the single-request pick served the same way: goodput" in done.output
    doc = load(tmp_path / "rec.yaml")
    assert doc["objective"] == "goodput" and doc["figures"]["goodput_tps"]["median"] >= 0
    assert doc["serving_command"][0] == "llama-server" and "-np" in doc["serving_command"]
    assert doc["settings"].get("n_parallel", 1) in (1, 2, 4) and doc["baseline"]["settings"]["n_parallel"] == 4
    assert doc["baseline"]["figures"]["capacity"]["sweep"][0]["users"] == 1  # the defaults, swept
    picked = load(tmp_path / "single.yaml")["settings"]
    served = doc["single_request_pick"]
    assert served["figures"]["capacity"]["sweep"] and served["settings"]["n_parallel"] == 4
    assert {k: served["settings"][k] for k in ("n_threads", "n_batch", "flash_attn")} == \
        {k: picked[k] for k in ("n_threads", "n_batch", "flash_attn")}
    report = runner.invoke(cli, ["report", "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}", "--workload",
                                 "serve-tiny", "--no-images", "-o", str(tmp_path / "report.html")])
    assert report.exit_code == 0, report.output
    page = (tmp_path / "report.html").read_text()
    assert "id='capacity'" in page


@pytest.mark.slow
def test_the_pinned_llama_server_takes_every_flag_autotune_exports(llama_server: str, tmp_path) -> None:
    """Each setting away from its default (mmap off, repacking off, slots, unified KV, quantized KV cache)
    becomes a flag this llama-server accepts: it starts and answers."""
    from tuner.backends.llama_cpp.server_process import LlamaServer, serving_flags
    from tuner.backends.settings import TrialSettings
    from tuner.config.model import resolve_model

    settings = TrialSettings(backend="llama_cpp", n_ctx=1024, n_batch=256, n_ubatch=128, n_threads=1,
                             n_threads_batch=1, flash_attn=True, type_k="q8_0", type_v="q8_0", use_mmap=False,
                             repack=False, n_parallel=2, kv_unified=True)
    flags = serving_flags(settings, str(resolve_model(None).path))
    assert {"-lm", "--no-repack", "--kv-unified", "-np"} <= set(flags)
    with LlamaServer(llama_server, flags, tmp_path / "server.log") as server:
        from tuner.backends.llama_cpp.serving import prompt_text

        assert prompt_text(server.base_url, 16)
