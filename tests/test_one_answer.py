"""One answer everywhere (issue 41): a run's targets and memory ceiling are stored with its study, and the
recommendation file, `autotune best`, `autotune export`, `tuner.autoconfig()`, `tuner.load()` and `autotune
serve` all ask the one decision rule with them, so each names the config the file names."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

import tuner
from tuner.backends.settings import TrialSettings, config_key, normalize
from tuner.cli import cli
from tuner.config.model import resolve_model
from tuner.config.workloads import get_workload
from tuner.errors import AutotuneError
from tuner.machine.profile import detect_profile
from tuner.measure import records as R
from tuner.measure.records import Stat
from tuner.results.storage import open_storage
from tuner.results.studies import StudyKey, open_study
from tuner.search.options import TuneOptions, make_sampler
from tuner.selection import asked, targets
from tuner.selection import candidates as select
from tuner.selection.targets import Targets

MIB = 1 << 20


def add_trial(study, seconds: list[float], peak_mib: int, role: str = "search", **settings) -> None:
    """A finished llama.cpp trial of ``settings`` with these request times and this peak memory."""
    full, _ = normalize(TrialSettings(**settings))
    rec = R.TrialRecord(role=role, settings=full.model_dump(), config_key=config_key(full), notes=(),
                        outcome=R.TrialOutcome(status=R.OK, wall_s=8.0, result={"ok": True},
                                               memory=R.Memory(peak_rss=peak_mib * MIB)),
                        prefill=Stat.of([1000 / s for s in seconds]), decode=Stat.of([100 / s for s in seconds]),
                        request=Stat.of(seconds))
    from optuna.trial import TrialState, create_trial

    study.add_trial(create_trial(state=TrialState.COMPLETE, value=sum(seconds) / len(seconds),
                                 user_attrs={R.RECORD_ATTR: rec.public()}))


def stored_run(url: str, wanted: Targets | None, ceiling: int | None):
    """A study of this machine, the bundled model and the tiny workload, as a run with ``wanted`` targets
    and a memory ceiling of ``ceiling`` leaves it: the fastest config peaks at 400 MiB, the next at 320 MiB."""
    storage = open_storage(url)
    profile = detect_profile()
    storage.save_profile(profile)
    space = SimpleNamespace(source="test", hash="0ne4nswer", distributions={})
    key = StudyKey(profile=profile, model=resolve_model(None), workload=get_workload("tiny"), space=space,
                   objective="request_time")
    study, _ = open_study(storage, key, make_sampler(1))
    add_trial(study, [3.00, 3.01, 3.02], 300, role="baseline", n_threads=1, flash_attn=False)
    add_trial(study, [2.00, 2.01, 2.02], 400, n_threads=2, flash_attn=True)     # the fastest
    add_trial(study, [2.50, 2.51, 2.52], 320, n_threads=2, flash_attn=False)
    targets.for_run(wanted, study, False)  # what tuner.search.run.prepare stores
    asked.store_ceiling(study, ceiling)
    return storage, study, key


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _picked(settings: dict) -> tuple:
    return settings["n_threads"], settings["flash_attn"]


def test_every_answer_names_the_config_of_the_recommendation_file(sqlite_url: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.search.tune import write_recommendation

    storage, study, key = stored_run(sqlite_url, Targets(max_memory=350 * MIB), 8 << 30)
    path, doc = write_recommendation(storage, study, key, TuneOptions(output=str(tmp_path / "rec.yaml")), 8 << 30)
    in_file = yaml.safe_load(Path(path).read_text())
    assert _picked(in_file["settings"]) == (2, False)  # within the target, not the fastest
    assert doc["settings"] == in_file["settings"]       # what the run's table shows

    shown = CliRunner().invoke(cli, ["best", "--workload", "tiny", "--storage", sqlite_url, "--format", "json"])
    assert shown.exit_code == 0, shown.output
    assert _picked(json.loads(shown.output)["recommendation"]["settings"]) == (2, False)
    exported = CliRunner().invoke(cli, ["export", "--workload", "tiny", "--storage", sqlite_url, "--format", "json"])
    assert exported.exit_code == 0, exported.output
    assert _picked(json.loads(exported.output)["settings"]) == (2, False)

    config = tuner.autoconfig(workload="tiny", storage=sqlite_url)
    assert config.source == "measured" and _picked(config.settings) == (2, False)

    import tuner.backends.llama_cpp.engine as engine

    loaded = {}
    monkeypatch.setattr(engine, "open_llama", lambda kwargs, repack: loaded.update(kwargs) or "a Llama")
    assert tuner.load(workload="tiny", storage=sqlite_url) == "a Llama"
    assert (loaded["n_threads"], loaded["flash_attn"]) == (2, False)

    import tuner.service.serve as service

    served = {}

    def fake_serve(config, port, engine_name, say=print, sock=None, several_users=False):
        served.update(config.settings)
        return 0

    monkeypatch.setattr(service, "serve", fake_serve)
    result = CliRunner().invoke(cli, ["serve", "--port", str(free_port()), "--workload", "tiny", "--storage", sqlite_url,
                                      "--engine", "llama-cpp-python"])
    assert result.exit_code == 0, result.output
    assert _picked(served) == (2, False) and "from: measured on this machine" in result.output


def test_a_target_nothing_meets_is_the_same_refusal_everywhere(sqlite_url: str) -> None:
    # Issue 41: after a run whose target no config met, `best` and `export` refused while autoconfig()
    # returned a measured config and `serve` served it.
    stored_run(sqlite_url, Targets(max_memory=200 * MIB), 8 << 30)
    shown = CliRunner().invoke(cli, ["best", "--workload", "tiny", "--storage", sqlite_url])
    assert shown.exit_code == 1 and "no measured config meets the targets" in shown.output
    with pytest.raises(AutotuneError, match="no measured config meets the targets"):
        tuner.autoconfig(workload="tiny", storage=sqlite_url)
    served = CliRunner().invoke(cli, ["serve", "--port", str(free_port()), "--workload", "tiny", "--storage", sqlite_url])
    assert served.exit_code == 1 and "no measured config meets the targets" in served.output


def test_the_stored_ceiling_applies_and_an_older_study_without_it_is_read_as_none(sqlite_url: str) -> None:
    storage, study, _ = stored_run(sqlite_url, None, 350 * MIB)
    assert asked.Asked.of(study.user_attrs) == asked.Asked(None, 350 * MIB)
    assert _picked(tuner.autoconfig(workload="tiny", storage=sqlite_url).settings) == (2, False)
    study.set_user_attr(asked.CEILING_ATTR, None)  # as a study stored before issue 41
    assert asked.Asked.of({}) == asked.Asked(None, None)
    assert _picked(tuner.autoconfig(workload="tiny", storage=sqlite_url).settings) == (2, True)
    cands = select.candidates(study)
    assert asked.Asked(None, 350 * MIB).best(cands, "request_time").peak_rss == 320 * MIB
