"""Optuna studies as autotune keys them: one per machine profile, model, workload, objective and space."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from typing import Any, Protocol

import optuna
import psutil
from optuna.trial import FrozenTrial, TrialState

from ..config import objectives
from ..measure import records as R
from ..errors import AutotuneError
from ..config.model import ModelInfo
from ..machine.profile import MachineProfile
from .storage import Storage
from ..config.workloads import Workload

class KeyedSpace(Protocol):
    """What a study key needs of a search space (:class:`tuner.search.space.ResolvedSpace` is one)."""

    source: str
    hash: str
    distributions: dict[str, Any]


PENDING_ATTR = "autotune_pending"  # set when a trial starts: who runs it and what


@dataclass(frozen=True)
class StudyKey:
    """What makes two runs the same study."""

    profile: MachineProfile
    model: ModelInfo
    workload: Workload
    space: KeyedSpace
    objective: str

    @property
    def prefix(self) -> str:
        """The study name without the space hash: the same tuning target."""
        return f"{self.profile.name}/{self.model.stem}-{self.model.short_id[:8]}/{self.workload.name}/{self.objective}"

    @property
    def name(self) -> str:
        """The study name."""
        return f"{self.prefix}/{self.space.hash}"

    def attrs(self) -> dict[str, Any]:
        """Study user attributes that describe the key."""
        return {
            "autotune_version": 1,
            "profile_id": self.profile.id,
            "profile_name": self.profile.name,
            "model": self.model.public(),
            "workload": self.workload.public(),
            "objective": self.objective,
            "space_source": self.space.source,
            "space_hash": self.space.hash,
            "space": {k: optuna.distributions.distribution_to_json(v)
                      for k, v in self.space.distributions.items()},
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }


def directions(objective: str) -> list[str]:
    """Optuna directions of an objective."""
    return list(objectives.get(objective).directions)


def sibling_studies(storage: Storage, key: StudyKey) -> list[str]:
    """Names of studies for the same target but another search space."""
    with storage.errors():
        names = [s.study_name for s in optuna.get_all_study_summaries(storage.rdb, include_best_trial=False)]
    return [n for n in names if n.startswith(key.prefix + "/") and n != key.name]


def open_study(storage: Storage, key: StudyKey, sampler: optuna.samplers.BaseSampler,
               pruner: optuna.pruners.BasePruner | None = None) -> tuple[optuna.Study, bool]:
    """Load the study for ``key`` or create it (with ``sampler`` and ``pruner``); returns the study and
    whether it already existed."""
    with storage.errors():
        existed = key.name in {s.study_name for s in optuna.get_all_study_summaries(
            storage.rdb, include_best_trial=False)}
        study = optuna.create_study(study_name=key.name, storage=storage.rdb, sampler=sampler, pruner=pruner,
                                    directions=directions(key.objective), load_if_exists=True)
        if study.user_attrs.get("profile_id") not in (None, key.profile.id):
            raise AutotuneError(f"study {key.name} belongs to machine {study.user_attrs['profile_id']}, "
                                f"not this one ({key.profile.id}): use another --profile name")
        if "profile_id" not in study.user_attrs:
            for name, value in key.attrs().items():
                study.set_user_attr(name, value)
    return study, existed


def find_studies(storage: Storage, profile: str | None = None, model: str | None = None,
                 workload: str | None = None) -> list[optuna.study.StudySummary]:
    """Studies matching a profile name, a model (file stem or sha prefix) and a workload."""
    with storage.errors():
        summaries = optuna.get_all_study_summaries(storage.rdb, include_best_trial=False)
    out = []
    for s in summaries:
        attrs = s.user_attrs
        if "profile_id" not in attrs:
            continue
        m = attrs.get("model", {})
        if profile and attrs.get("profile_name") != profile:
            continue
        if model and model not in (m.get("sha256", "")[:len(model)], os.path.basename(m.get("path", "")),
                                   m.get("path", "").rsplit("/", 1)[-1].rsplit(".", 1)[0]):
            continue
        if workload and attrs.get("workload", {}).get("name") != workload:
            continue
        out.append(s)
    return out


def _this_worker_is_gone(worker: dict[str, Any]) -> bool:
    if worker.get("host") != platform.node():
        return False
    pid = worker.get("pid")
    if not isinstance(pid, int) or not psutil.pid_exists(pid):
        return True
    try:
        return psutil.Process(pid).create_time() > float(worker.get("started", 0)) + 1
    except psutil.Error:
        return True


def baseline_running(study: optuna.Study, backend: str) -> bool:
    """Whether another worker is measuring ``backend``'s baseline in ``study`` right now."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pending = trial.user_attrs.get(PENDING_ATTR) or {}
        if pending.get("role") == R.Role.BASELINE and pending.get("settings", {}).get("backend") == backend:
            return True
    return False


def fail_orphans(storage: Storage, study: optuna.Study) -> list[int]:
    """Mark RUNNING trials whose worker is gone as failed (orphaned); returns their numbers.

    A worker on this host is checked by its process id; a worker elsewhere by Optuna's
    heartbeat (a trial without a heartbeat for the grace period is stale). A trial that
    another worker marks or finishes first is left to it.
    """
    failed = []
    with storage.errors():
        stale = storage.stale_trial_ids(study)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            pending = trial.user_attrs.get(PENDING_ATTR) or {}
            worker = pending.get("worker", {})
            if worker.get("host") == platform.node():
                if not _this_worker_is_gone(worker):
                    continue
                reason = f"worker pid {worker.get('pid')} on {platform.node()} is gone"
            elif storage.trial_id(trial) in stale:
                reason = (f"no heartbeat from worker pid {worker.get('pid', '?')} on {worker.get('host', '?')} "
                          f"for over {storage.rdb.grace_period}s")
            else:
                continue
            if mark_failed(storage, storage.trial_id(trial), pending, R.ORPHANED, reason):
                failed.append(trial.number)
    return sorted(failed)


def mark_failed(storage: Storage, trial_id: int, pending: dict[str, Any], status: str, reason: str) -> bool:
    """Store a failure record on a running trial (``trial_id`` is :meth:`Storage.trial_id`) and set it FAIL.

    Returns False when the trial has finished meanwhile (its worker told it, or another
    worker marked it first).
    """
    record = R.TrialRecord(role=R.Role.of(pending.get("role", R.Role.SEARCH)), settings=pending.get("settings", {}),
                           config_key=pending.get("config_key", ""), notes=tuple(pending.get("notes", ())),
                           outcome=R.TrialOutcome(status=status, reason=reason),
                           model=pending.get("model", {}), worker=pending.get("worker", {}))
    return storage.fail_trial(trial_id, {R.RECORD_ATTR: json.loads(json.dumps(record.public()))})


# The Optuna names the layers above use: this layer is where Optuna lives (with search/ and the report),
# so selection/ and recommend/ name studies and trials through these instead of importing optuna.
Study = optuna.Study
StudySummary = optuna.study.StudySummary
OptunaError = optuna.exceptions.OptunaError
__all__ = ["FrozenTrial", "OptunaError", "Study", "StudySummary", "TrialState"]


def load_study(storage: Storage, name: str) -> Study:
    """The stored study called ``name``."""
    return optuna.load_study(study_name=name, storage=storage.rdb)


def study_summaries(storage: Storage) -> list[StudySummary]:
    """A summary of every stored study (name, user attributes, trial count)."""
    return optuna.get_all_study_summaries(storage.rdb, include_best_trial=False)
