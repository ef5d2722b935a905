"""Targets (issue 29): --min-decode / --min-prefill / --max-memory. A real short run with a target no
config can meet ends with one line naming the missed target and the closest config (exit 1); with a
reachable target the recommendation meets it and is the best-quality config that does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import TINY_SPACE

from tuner.cli import cli
from tuner.measure.records import Stat
from tuner.selection.candidates import Candidate
from tuner.selection import decision
from tuner.selection.targets import Targets, closest, explain, quality_key

SPACE = TINY_SPACE + "  quant: {choices: [source, Q8_0]}\n"


def _cand(key: str, decode: float, prefill: float, kl: float | None, quant: str, threads: int, rss: int = 10**8,
          request: float = 1.0) -> Candidate:
    return Candidate(config_key=key, settings={"backend": "llama_cpp", "quant": quant, "n_threads": threads},
                     trials=(int(key),), roles=("search",), prefill=Stat.of([prefill]), decode=Stat.of([decode]),
                     ttft=None, peak_rss=rss, request=Stat.of([request]),
                     extra={} if kl is None else {"kl_mean": kl})


def test_pick_is_best_quality_meeting_targets_and_explain_names_the_change() -> None:
    cands = [_cand("1", 50, 300, None, "source", 1, request=2.0), _cand("2", 80, 400, 0.005, "Q8_0", 1),
             _cand("3", 95, 500, 0.26, "Q4_0", 1, request=0.5), _cand("4", 60, 300, None, "source", 2, request=1.5)]
    assert quality_key(cands[0]) == 0.0 and quality_key(cands[2]) == 0.26
    assert decision.best(cands, "request_time", targets=Targets(min_decode=55)).config_key == "4"  # source, KL 0, faster request
    assert decision.best(cands, "request_time", targets=Targets(min_decode=70)).config_key == "2"  # Q8_0 beats Q4_0 on KL
    assert decision.best(cands, "request_time", targets=Targets(min_decode=70, max_memory=10**7)) is None
    far = Targets(min_decode=200)
    assert decision.best(cands, "request_time", targets=far) is None and closest(cands, far).config_key == "3"
    message = far.miss_message(cands)
    assert "decode 95.0 t/s against the target 200.0 t/s (52% short)" in message and "trials 3" in message
    lines = explain(cands, Targets(min_decode=100))
    assert len(lines) == 3 and any("quant Q8_0 -> Q4_0: decode 80.0 t/s -> 95.0 t/s" in line for line in lines)


def _run(tmp_path: Path, *extra: str) -> tuple[int, str]:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    result = CliRunner().invoke(cli, ["run", "--budget", "25s", "--workload", "tiny", "--space", str(space),
                                      "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--repetitions", "1",
                                      "--seed", "1", "--max-quality-loss", "none", "-o", str(tmp_path / "rec.yaml"),
                                      *extra])
    return result.exit_code, result.output


@pytest.mark.slow
def test_unreachable_target_names_the_miss_and_a_reachable_one_is_met(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "--min-decode", "10000", "--explain")
    last = out.strip().splitlines()[-1]
    assert code == 1, out
    assert last.startswith("Error: no measured config meets the targets: the closest, trials ") and \
        "against the target 10000.0 t/s" in last, out
    assert "explain: trials" in out
    code, out = _run(tmp_path, "--min-decode", "1")
    assert code == 0, out
    doc = yaml.safe_load((tmp_path / "rec.yaml").read_text())
    assert doc["figures"]["decode_tps"]["median"] >= 1
    assert "Weight types tried (KL: nats per token against the source)" in out
    rows = {r["quant"]: r for r in doc["quants"]}
    assert rows["source"]["kl_mean"] == 0 and rows["source"]["top_agreement"] == 1
    if "Q8_0" in rows:
        assert rows["Q8_0"]["kl_mean"] > 0 and rows["Q8_0"]["top_agreement"] < 1
    trials = json.loads(CliRunner().invoke(cli, ["trials", "--storage", f"sqlite:///{tmp_path / 'a.db'}",
                                                 "--format", "json"]).stdout)["trials"]
    kinds = {r["settings"].get("quant") for r in trials if r["state"] == "complete"}
    if "source" in kinds:  # the source's KL is 0: nothing beats it on quality when it meets the target
        assert doc["settings"]["quant"] == "source"
