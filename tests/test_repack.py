"""Weight repacking (llama.cpp's extra buffer types): the engine probe, the setting carried by every
consumer of a config, and runs that survive the crash it causes on virtualized AMX Xeons.

On a machine without that crash it is simulated for real: ``AUTOTUNE_FAULT=repack-crash`` makes every
engine child that loads quantized weights with repacking on die by SIGSEGV (``tuner.backends.llama_cpp.engine``).
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from click.testing import CliRunner
from fixtures.invented import invented_db  # noqa: F401  (a fixture)

from tuner.measure import records as R
from tuner.cli import cli
from tuner.backends.llama_cpp.engine import open_llama, uses_extra_bufts
from tuner.backends.llama_cpp.health import EngineHealth, engine_key, probe_repack
from tuner.config.model import resolve_model
from tuner.search.progress import Progress
from tuner.backends.llama_cpp.quant import ensure_variant
from tuner.measure.records import record_of
from tuner.search.tune import TuneOptions, tune
from tuner.backends.llama_cpp.kwargs import model_params, server_flags
from tuner.backends.settings import TrialSettings
from tuner.results.storage import open_storage

REPACK_SPACE = """\
version: 1
params:
  quant: {choices: [source, F16]}
  n_threads: {low: 1, high: auto}
  repack: {choices: [true, false]}
  n_ctx: {choices: [256]}
"""


def _has_amx() -> bool:
    return "amx_int8" in Path("/proc/cpuinfo").read_text()


def test_probe_on_this_machine_runs_or_names_the_signal(model_path: Path) -> None:
    verdict = probe_repack(str(model_path), "Q4_1")
    if not _has_amx():  # only llama.cpp's AMX path is known to crash
        assert verdict.usable and verdict.status == R.OK, verdict
    else:
        assert verdict.usable or verdict.signal, verdict


@pytest.mark.slow
def test_simulated_crash_is_probed_per_weight_type(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f16 = ensure_variant(resolve_model(model_path), "F16")
    monkeypatch.setenv("AUTOTUNE_FAULT", "repack-crash")
    bad = probe_repack(str(model_path), "Q4_1")
    assert not bad.usable and bad.status == R.CRASHED and bad.signal == "SIGSEGV", bad
    assert "engine.py" in bad.stderr_tail  # faulthandler's stack of the crashed child
    assert bad.evidence.startswith("Q4_1: repacking crashed llama.cpp (SIGSEGV)")
    assert probe_repack(f16.path, "F16").usable  # unquantized weights never take the crashing path


def test_verdicts_are_probed_once_and_kept_for_one_engine(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_FAULT", "repack-crash")
    saved: list[dict] = []
    key = engine_key("0.3.36", "AVX512 = 1 | AMX_INT8 = 1")
    health = EngineHealth(key=key, on_change=saved.append)
    lines: list[str] = []
    first = health.repack_verdict("Q4_1", str(model_path), lines.append)
    again = health.repack_verdict("Q4_1", str(model_path), lines.append)
    assert first is again and not first.usable
    assert len(saved) == 1 and saved[0]["repack_unusable"] == ["Q4_1"]
    assert any("runs with repacking off" in line for line in lines)
    kept = EngineHealth.from_extra({"engine": saved[0]}, key)
    assert not kept.verdicts["Q4_1"].usable
    assert EngineHealth.from_extra({"engine": saved[0]}, engine_key("0.3.37", "AVX512 = 1")).verdicts == {}


@pytest.mark.engine
def test_open_llama_sets_the_model_parameter_and_restores_the_default(model_path: Path) -> None:
    import llama_cpp.llama_cpp as lib

    off = open_llama({"model_path": str(model_path), "n_ctx": 64}, repack=False)
    assert uses_extra_bufts(off) is False
    assert lib.llama_model_default_params().use_extra_bufts is True  # the patch is gone
    assert off.create_completion("The sea", max_tokens=2, temperature=0)["usage"]["completion_tokens"] == 2


def test_every_consumer_of_a_config_carries_repack(model_path: Path) -> None:
    off = TrialSettings(backend="llama_cpp", repack=False)
    assert "--no-repack" in server_flags(off, "m.gguf")
    assert "--no-repack" not in server_flags(TrialSettings(backend="llama_cpp"), "m.gguf")
    assert model_params(off) == {"use_extra_bufts": False}


@pytest.mark.engine
@pytest.mark.slow
def test_a_recommendation_without_repacking_loads_without_it(invented_db: str, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "laptop.yaml"
    result = CliRunner().invoke(cli, ["export", "--storage", invented_db, "--profile", "laptop-4c", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(out.read_text())
    doc["llama_cpp_model_params"] = {"use_extra_bufts": False}
    doc["settings"]["repack"] = False
    out.write_text(yaml.safe_dump(doc))
    for fmt, words in (("llama-cpp-server", "llama_cpp.server has no setting for weight repacking"),
                       ("ollama", "repack=false")):
        res = CliRunner().invoke(cli, ["export", "--from", str(out), "--format", fmt])
        assert res.exit_code == 0 and words in res.output, res.output
    from tuner import llama_from_recommendation

    assert uses_extra_bufts(llama_from_recommendation(out)) is False


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    storage = open_storage(url)
    (summary,) = optuna.get_all_study_summaries(storage.rdb)
    return optuna.load_study(study_name=summary.study_name, storage=storage.rdb).get_trials()


@pytest.mark.slow
def test_a_run_on_a_machine_whose_repacking_crashes(tmp_path: Path, sqlite_url: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's promise on an AMX VM: the run recommends a measured llama.cpp config anyway."""
    space = tmp_path / "repack.yaml"
    space.write_text(REPACK_SPACE)
    monkeypatch.setenv("AUTOTUNE_FAULT", "repack-crash")
    lines: list[str] = []

    class Lines(Progress):
        def status(self, text: str) -> None:
            lines.append(text)

    result = tune(TuneOptions(budget_s=40, space=str(space), workload="tiny", storage=sqlite_url,
                              repetitions=1, seed=3), Lines())
    doc = result.recommendation
    assert doc is not None and doc["settings"]["backend"] == "llama_cpp"
    assert doc["engine"]["repack_unusable"] == ["Q4_1"]
    assert doc["speedup"]["decode"] > 0 and doc["figures"]["decode_tps"]["median"] > 0
    assert any("Q4_1: repacking crashed llama.cpp (SIGSEGV)" in line for line in lines), lines
    records = [record_of(t) for t in _trials(sqlite_url)]
    base = next(r for r in records if r.role == "baseline")
    assert base.outcome.ok and base.settings["repack"] is False
    assert any(note.startswith("repack off: Q4_1") for note in base.notes)
    ran = [r for r in records if r and r.outcome.ok]
    assert all(not r.settings["repack"] for r in ran if r.settings["quant"] == "source")
    assert not [r for r in records if r and r.outcome.status == R.CRASHED]  # the probe kept every trial alive
    stored = open_storage(sqlite_url).profile(doc["profile"]["name"])
    assert stored.extra["engine"]["repack_unusable"] == ["Q4_1"]


@pytest.mark.slow
def test_a_baseline_killed_by_a_signal_is_retried_without_repacking(tiny_space: Path, sqlite_url: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_FAULT", "segfault:0")
    result = tune(TuneOptions(budget_s=15, space=str(tiny_space), workload="tiny", storage=sqlite_url,
                              repetitions=1, max_quality_loss=None))
    trials = {t.number: record_of(t) for t in _trials(sqlite_url)}
    assert trials[0].role == "baseline" and trials[0].outcome.signal == "SIGSEGV"
    assert trials[1].role == "baseline" and trials[1].outcome.ok and trials[1].settings["repack"] is False
    assert any("retried with repack=False" in note for note in trials[1].notes)
    assert result.recommendation["baseline"]["settings"]["repack"] is False
    assert result.recommendation["engine"]["repack_unusable"] == ["Q4_1"]
