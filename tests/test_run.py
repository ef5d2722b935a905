"""The main path, end to end with the real engine and the bundled model: trials, a short
budgeted run into a temporary SQLite database, resume, and the recommendation round trip."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from tuner import llama_from_recommendation, load_recommendation
from tuner.cli import cli
from tuner.measure.records import OK, OVER_CEILING, record_of
from tuner.measure.runner import run_child
from tuner.backends.settings import TrialSettings
from tuner.results.storage import open_storage
from tuner.config.workloads import get_workload

BUDGET_S = 35


def tiny_spec(model_path: Path, **settings) -> dict:
    return {"model_path": str(model_path), "settings": TrialSettings(n_ctx=256, **settings).model_dump(),
            "workload": get_workload("tiny").model_dump(), "repetitions": 3}


@pytest.mark.slow
def test_one_real_trial(model_path: Path, repack_ok: bool) -> None:
    outcome = run_child(tiny_spec(model_path, n_threads=1, n_threads_batch=2, repack=repack_ok), timeout_s=120,
                        memory_ceiling=4 << 30)
    assert outcome.status == OK, outcome.stderr_tail
    result = outcome.result
    assert len(result["prefill_tps"]) == len(result["decode_tps"]) == 3
    assert min(result["prefill_tps"]) > 0 and min(result["decode_tps"]) > 0
    assert result["prompt_tokens"] == 64 and result["generate_tokens"] == 16
    assert outcome.memory.peak_rss > model_path.stat().st_size
    assert outcome.memory.peak_file > 0 and outcome.memory.peak_anon > 0


def test_ceiling_below_real_usage_is_over_ceiling(model_path: Path) -> None:
    # Above the file size (so the up-front check passes) but below what the process really uses.
    ceiling = model_path.stat().st_size + (20 << 20)
    outcome = run_child(tiny_spec(model_path), timeout_s=120, memory_ceiling=ceiling)
    assert outcome.status == OVER_CEILING
    assert outcome.signal == "SIGKILL"
    assert outcome.memory.peak_rss > ceiling


def _run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.engine
@pytest.mark.slow
def test_short_run_resume_and_round_trip(tiny_space: Path, sqlite_url: str, hermetic: Path) -> None:
    args = ["run", "--budget", f"{BUDGET_S}s", "--workload", "tiny", "--space", str(tiny_space),
            "--storage", sqlite_url, "--repetitions", "2", "--trial-timeout", "60s", "--seed", "7"]
    code, out = _run(args)
    assert code == 0, out
    assert "Recommendation written to" in out
    storage = open_storage(sqlite_url)
    (summary,) = optuna.get_all_study_summaries(storage.rdb)
    study = optuna.load_study(study_name=summary.study_name, storage=storage.rdb)
    first = study.get_trials()
    roles = [record_of(t).role for t in first]
    assert roles[0] == "baseline"
    assert "search" in roles
    assert all(t.state.is_finished() for t in first)

    # Same command again: the same study continues.
    code, out = _run(args)
    assert code == 0, out
    assert "(resumed)" in out
    assert len(optuna.get_all_study_summaries(storage.rdb)) == 1
    again = optuna.load_study(study_name=summary.study_name, storage=storage.rdb).get_trials()
    assert len(again) > len(first)
    assert sum(record_of(t).role == "baseline" for t in again) == 1  # baseline measured once

    # The recommendation file loads and builds a working Llama.
    (path,) = list(hermetic.glob("*/*.yaml"))
    doc = load_recommendation(path)
    assert doc["version"] == 1 and doc["workload"]["name"] == "tiny"
    assert doc["figures"]["decode_tps"]["median"] > 0
    assert doc["speedup"]["decode"] > 0 and doc["baseline"]["settings"]["n_threads"] >= 1
    assert doc["llama_cpp_kwargs"]["n_threads_batch"] == doc["settings"]["n_threads_batch"]
    # The roofline holds decode against the bandwidth its thread count can draw on.
    prof = storage.profile(doc["profile"]["name"])
    assert prof.memory_bandwidth_gbs and prof.memory_bandwidth_all_gbs
    roof = doc["roofline"]
    assert roof["decode_threads"] == doc["settings"]["n_threads"]
    assert roof["memory_bandwidth_gbs"] == prof.bandwidth_for(doc["settings"]["n_threads"])
    llm = llama_from_recommendation(path)
    out = llm.create_completion("The lighthouse keeper", max_tokens=4, temperature=0)
    assert out["choices"][0]["text"].strip()


@pytest.mark.slow
def test_changed_space_starts_a_new_study(tiny_space: Path, sqlite_url: str, tmp_path: Path) -> None:
    from tuner.search.tune import TuneOptions, tune

    common = dict(budget_s=12, workload="tiny", storage=sqlite_url, repetitions=1, max_quality_loss=None)
    first = tune(TuneOptions(space=str(tiny_space), **common))
    # Batch sizes above the tiny workload's prompt cannot change a measurement, so replacing 128 and
    # 512 with 256 leaves the searched space as it was: the study resumes.
    unfelt = tmp_path / "unfelt.yaml"
    unfelt.write_text(tiny_space.read_text().replace("[64, 128, 512]", "[64, 256]"))
    same = tune(TuneOptions(space=str(unfelt), **common))
    assert same.resumed and same.study_name == first.study_name
    # Flash attention changes every measurement, so a space without it is a new study.
    other = tmp_path / "other.yaml"
    other.write_text(tiny_space.read_text().replace("flash_attn: {choices: [true, false]}",
                                                    "flash_attn: {choices: [false]}"))
    second = tune(TuneOptions(space=str(other), **common))
    assert first.study_name != second.study_name
    assert any("search space differs" in note for note in second.notes), (first, second)


@pytest.mark.parametrize("args, words", [
    (["--budget", "0"], "more than zero"),
    (["--budget", "soon"], "cannot read the duration"),
    (["--model", "/nonexistent/model.gguf"], "does not exist"),
    (["--memory-ceiling", "10MB"], "smaller than the model"),
    (["--memory-ceiling", "lots"], "cannot read the size"),
    (["--workload", "nope"], "unknown workload"),
    (["--workload", "long-prompt", "--space", "TINY"], "largest n_ctx is 512"),
    (["--storage", "postgresql://nobody@127.0.0.1:1/none"], "check that the server is running"),
])
def test_bad_input_is_one_line_and_exit_1(args: list[str], words: str, tiny_space: Path, sqlite_url: str,
                                          hermetic: Path) -> None:
    args = [str(tiny_space) if a == "TINY" else a for a in args]
    if "--storage" not in args:
        args += ["--storage", sqlite_url]
    result = CliRunner().invoke(cli, ["run", *args])
    assert result.exit_code == 1, result.output
    assert words in result.output
    assert result.output.count("\n") == 1 and result.output.startswith("Error: ")
    assert not list(hermetic.glob("*/*.yaml"))
