"""Ranking by the wait a user feels: the request-time objective, ties within noise, and `autotune check`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tuner.selection import decision, candidates as select
from tuner.config import objectives
from tuner.recommend.check import check, verdict
from tuner.cli import cli
from tuner.measure.records import Stat
from tuner.search.tune import TuneOptions, tune

PROMPT, GENERATED = 512, 128


def cand(key: str, prefill: float, decode: float, cv: float = 0.02, roles: tuple[str, ...] = ("search",),
         **settings) -> select.Candidate:
    """A pooled config with figures as a real trial stores them (request = prefill + decode time)."""
    request = PROMPT / prefill + GENERATED / decode

    def stat(v: float) -> Stat:  # three repetitions spread as the CV says
        return Stat.of([v * (1 - cv), v, v * (1 + cv)])  # type: ignore[return-value]

    return select.Candidate(config_key=key, settings={"backend": "llama_cpp", **settings}, trials=(0,), roles=roles,
                            prefill=stat(prefill), decode=stat(decode), ttft=stat(PROMPT / prefill), peak_rss=1,
                            request=stat(request))


def test_the_pick_follows_the_request_time_where_the_geometric_mean_disagrees() -> None:
    # The two baselines of the issue: llama.cpp on a disturbed trial, transformers decoding at 13 t/s.
    llama = cand("llama", prefill=66.0, decode=52.9, roles=("baseline",))
    hf = cand("hf", prefill=439.0, decode=13.4, roles=("baseline",))
    assert decision.best([llama, hf], "balanced") is hf  # geometric mean 76.7 against 59.1
    assert decision.best([llama, hf], "request_time") is llama  # 10.2 s against 10.7 s
    assert objectives.DEFAULT == "request_time"
    assert objectives.get("request_time").values(llama) == [pytest.approx(PROMPT / 66 + GENERATED / 52.9)]


def test_a_tie_within_noise_goes_to_the_config_that_changes_fewer_settings() -> None:
    base = cand("base", prefill=300.0, decode=90.0, cv=0.005, roles=("baseline",), n_threads=1, flash_attn=False)
    tuned = cand("tuned", prefill=302.0, decode=90.5, cv=0.005, n_threads=2, flash_attn=True)
    much = cand("much", prefill=900.0, decode=120.0, cv=0.005, n_threads=2, flash_attn=True)
    # 0.6% apart, 0.5% spread: the whole interval of the shift inside 3%, a tie (issue 41: a wider
    # spread is undecided, not a tie)
    assert decision.best([base, tuned], "request_time") is base
    assert decision.best([base, tuned, much], "request_time") is much
    # With several objectives only the Pareto front competes: the baseline, dominated within noise,
    # is not recommended even though it changes fewer settings.
    assert decision.best([base, tuned], "pareto") is tuned and decision.pareto_front([base, tuned]) == [tuned]


def test_the_verdict_of_a_check() -> None:
    stored = {"request": 2.0, "decode": 100.0, "prefill": 500.0}
    now = {"recommended": {"request": 2.05, "decode": 98.0, "prefill": 490.0}, "baseline": {"request": 3.5}}
    assert verdict(now, stored, 0.1)[0]
    slow = {**now, "recommended": {"request": 2.6, "decode": 70.0, "prefill": 480.0}}
    ok, line = verdict(slow, stored, 0.1)
    assert not ok and line.startswith("request is 2.60 s now against the stored 2.00 s (+30%")
    ok, line = verdict({**now, "baseline": {"request": 1.9}}, stored, 0.1)
    assert not ok and "no longer beats the defaults" in line


@pytest.mark.slow
def test_a_run_ranks_by_request_time_and_check_holds_until_the_figures_are_quadrupled(
        tmp_path: Path, sqlite_url: str) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("version: 1\nparams:\n  quant: {choices: [source, Q8_0]}\n  n_threads: {low: 1, high: auto}\n"
                     "  flash_attn: {choices: [true, false]}\n  n_ctx: {choices: [256]}\n")
    result = tune(TuneOptions(budget_s=30, space=str(space), workload="tiny", storage=sqlite_url, repetitions=2,
                              seed=1, max_quality_loss=None))
    doc = result.recommendation
    assert doc["objective"] == "request_time"
    chosen, base = doc["figures"]["request_s"]["median"], doc["baseline"]["figures"]["request_s"]["median"]
    assert chosen <= base and doc["speedup"]["request"] == pytest.approx(base / chosen, rel=1e-3)

    held = check(result.recommendation_path, rounds=1, repetitions=2, tolerance=0.5)
    assert held.ok, (held.reason, held.now)
    # Four times the stored speed: far outside 50% whatever the load. (Twice was at the edge: a check measured
    # 25% faster than the run, which shared the CPUs with the suite's other worker, held the doubled figures.)
    raised = yaml.safe_load(result.recommendation_path.read_text())
    for key in ("prefill_tps", "decode_tps"):
        raised["figures"][key]["median"] *= 4
    raised["figures"]["request_s"]["median"] /= 4
    (tmp_path / "raised.yaml").write_text(yaml.safe_dump(raised))
    run = CliRunner().invoke(cli, ["check", str(tmp_path / "raised.yaml"), "--rounds", "1", "--tolerance", "50%"])
    assert run.exit_code == 1, run.output
    errors = [line for line in run.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "against the stored" in errors[0], run.output
