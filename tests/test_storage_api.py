"""The Optuna API behind :class:`tuner.results.storage.Storage`, checked against a real SQLite study.

``Storage`` is the one place autotune reaches into Optuna's private names (trial and study ids,
stale-heartbeat lookup) and relies on ``enqueue_trial(skip_if_exists=True)``. These tests fail
loudly when an Optuna upgrade changes any of them.
"""

from __future__ import annotations

import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.search.informed import INFORMED_ATTR, enqueue_next, informed_configs
from tuner.search.space import load_space
from tuner.results.storage import Storage, open_storage

REPO = Path(__file__).resolve().parent.parent

# heartbeats with ask/tell are intended here: autotune records them itself around each trial
pytestmark = [pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
              pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")]


@pytest.fixture
def storage(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Storage:
    """A fresh SQLite database whose heartbeat grace period is one second."""
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_GRACE", "1")
    return open_storage(sqlite_url)


def test_trial_and_study_ids(storage: Storage) -> None:
    first = optuna.create_study(study_name="first", storage=storage.rdb)
    second = optuna.create_study(study_name="second", storage=storage.rdb)
    summaries = {s.study_name: s for s in optuna.get_all_study_summaries(storage.rdb, include_best_trial=False)}
    assert Storage.study_id(summaries["first"]) == storage.study_id(first)
    assert Storage.study_id(summaries["second"]) == storage.study_id(second) > storage.study_id(first)
    one, other = first.ask(), second.ask()
    assert one.number == other.number == 0 and storage.trial_id(one) != storage.trial_id(other)
    (frozen,) = first.get_trials()
    assert storage.trial_id(frozen) == storage.trial_id(one)
    assert storage.rdb.get_trial(storage.trial_id(other)).number == 0


def test_heartbeat_stale_trials_and_failing_one(storage: Storage) -> None:
    study = optuna.create_study(study_name="beats", storage=storage.rdb)
    silent, alive, never = study.ask(), study.ask(), study.ask()
    storage.heartbeat(silent)
    storage.heartbeat(alive)
    assert storage.stale_trial_ids(study) == set()  # within the grace period
    time.sleep(2.2)  # SQLite's clock has whole seconds
    storage.heartbeat(alive)
    # ``never`` sent no heartbeat, so it is not stale: autotune checks its worker by pid instead.
    assert storage.stale_trial_ids(study) == {storage.trial_id(silent)}
    assert never.number == 2 and study.get_trials()[2].state == TrialState.RUNNING

    assert storage.fail_trial(storage.trial_id(silent), {"why": "stale"}) is True
    failed = study.get_trials()[silent.number]
    assert failed.state == TrialState.FAIL and failed.user_attrs == {"why": "stale"}
    assert storage.stale_trial_ids(study) == set()  # only RUNNING trials are stale
    # A finished trial is left alone: False, nothing changed.
    assert storage.fail_trial(storage.trial_id(silent), {"why": "again"}) is False
    assert study.get_trials()[silent.number].user_attrs == {"why": "stale"}
    study.tell(alive, 1.0)
    assert storage.fail_trial(storage.trial_id(alive), {"why": "late"}) is False
    assert study.get_trials()[alive.number].state == TrialState.COMPLETE


def test_an_informed_start_is_queued_once(storage: Storage) -> None:
    space = load_space(REPO / "search_spaces" / "cpu.yaml").resolve(cpus=2, needed_ctx=640)
    llama, _ = informed_configs(space, physical_cores=2, logical_cores=2)
    study = optuna.create_study(study_name="informed", storage=storage.rdb, directions=["maximize"] * 2)

    def waiting() -> list[int]:
        return [t.number for t in study.get_trials(states=(TrialState.WAITING,))]

    assert enqueue_next(study, space, physical_cores=2, logical_cores=2) is True
    assert waiting() == [0]
    # The same params again: Optuna keeps the one WAITING trial.
    study.enqueue_trial(llama, user_attrs={INFORMED_ATTR: True}, skip_if_exists=True)
    assert waiting() == [0]

    trial = study.ask()
    assert trial.number == 0 and trial.user_attrs == {INFORMED_ATTR: True} and waiting() == []
    assert space.suggest(trial).quant == "Q8_0"
    study.tell(trial, [1.0, 1.0])
    # A start the study has had (here: completed) is skipped; the next one is queued, once.
    assert enqueue_next(study, space, physical_cores=2, logical_cores=2) is True
    assert enqueue_next(study, space, physical_cores=2, logical_cores=2) is False
    assert waiting() == [1]
    assert space.suggest(study.ask()).dtype == "bfloat16"
