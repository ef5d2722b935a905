"""Finding what a results command reports on: the study of a profile, model and workload.

Several studies can share a tuning target (same profile, model and workload) when the
search space or the objective changed between runs; the most recent one is the current
answer. Studies of different models or workloads are never mixed: a choice between
them is the user's, made with ``--model`` and ``--workload``.
"""

from __future__ import annotations

import contextlib
from shlex import quote
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from .. import backends
from ..selection import decision, candidates as select
from ..config import objectives
from . import document as recommend
from ..errors import AutotuneError
from ..util.paths import default_storage_url
from ..machine.profile import MachineProfile, detect_profile
from ..measure.records import CUT, FAILED_STATUSES, OK, PRUNED, REPEAT, TrialRecord, record_of
from ..results import readonly
from ..results.db_errors import db_error_message, redact
from ..results.storage import Storage, open_storage
from ..results.studies import (PENDING_ATTR, FrozenTrial, Study, StudySummary, TrialState, find_studies, load_study,
                               study_summaries)
from .summary import recommendation_extras
from ..selection.asked import Asked
from ..util.units import format_bytes

Summary = StudySummary


def open_results(url: str | None = None) -> Storage:
    """Open an existing results database; a missing SQLite file is a user error, not created."""
    url = url or default_storage_url()
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - open_storage words the message
        return open_storage(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        if not Path(parsed.database).is_file():
            raise AutotuneError(f"there is no results database at {parsed.database}: run `autotune run` "
                                "first, or pass --storage URL")
        if not _has_results(Path(parsed.database)):  # read-only: an empty file stays empty
            raise AutotuneError(f"the database {redact(url)} has no results yet: run `autotune run` first")
        if not readonly.writable(Path(parsed.database)):  # a read-only or immutable results folder: read it
            storage = readonly.open_read_only(Path(parsed.database), url)
            if not storage.profiles():
                raise AutotuneError(f"the database {redact(url)} has no results yet: run `autotune run` first")
            return storage
    storage = open_storage(url)
    if not storage.profiles():
        raise AutotuneError(f"the database {redact(url)} has no results yet: run `autotune run` first")
    return storage


def _has_results(path: Path) -> bool:
    """Whether the SQLite file at ``path`` holds autotune's tables, read without writing anything."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            row = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='autotune_profiles'").fetchone()
    except sqlite3.Error as exc:
        raise AutotuneError(db_error_message(exc, f"sqlite:///{path.resolve()}")) from None
    return row is not None


def this_profile_name() -> str:
    """The profile name ``autotune run`` gives this machine by default."""
    return detect_profile().name


def target_of(summary: Summary) -> tuple[str, str]:
    """What a study tunes: the model's sha256 and the workload name."""
    attrs = summary.user_attrs
    return attrs.get("model", {}).get("sha256", ""), attrs.get("workload", {}).get("name", "")


def model_stem(attrs: dict[str, Any]) -> str:
    """The file name stem of a study's model, which ``--model`` accepts."""
    return Path(attrs.get("model", {}).get("path", "?")).stem


def target_label(summary: Summary) -> str:
    """``--model STEM --workload NAME``: the filters that select a study's target."""
    attrs = summary.user_attrs
    return f"--model {quote(model_stem(attrs))} --workload {quote(attrs.get('workload', {}).get('name', '?'))}"


def _recency(summary: Summary) -> tuple[str, int]:
    return str(summary.user_attrs.get("created_at", "")), Storage.study_id(summary)


def newest_first(summaries: list[Summary]) -> list[Summary]:
    """``summaries`` most recent first (the first of a target is the study ``autotune best`` reports on)."""
    return sorted(summaries, key=_recency, reverse=True)


def latest_by_target(summaries: list[Summary]) -> dict[tuple[str, str], Summary]:
    """The most recent study of every target among ``summaries``."""
    out: dict[tuple[str, str], Summary] = {}
    for summary in sorted(summaries, key=_recency):
        out[target_of(summary)] = summary
    return out


def find_study(storage: Storage, profile: str, model: str | None = None,
               workload: str | None = None) -> Summary:
    """The one study of ``profile`` matching the filters; ambiguity and absence are user errors."""
    storage.profile(profile)  # an unknown name lists the known ones
    matches = find_studies(storage, profile, model, workload)
    if not matches:
        known = sorted({target_label(s) for s in find_studies(storage, profile)})
        if not known:
            raise AutotuneError(f"profile {profile!r} has no study yet: run `autotune run --profile {quote(profile)}`")
        asked = " ".join(f"--{k} {v}" for k, v in (("model", model), ("workload", workload)) if v)
        raise AutotuneError(f"no study of profile {profile!r} matches {asked}: its studies are "
                            + "; ".join(known))
    latest = latest_by_target(matches)
    if len(latest) > 1:
        labels = "; ".join(sorted(target_label(s) for s in latest.values()))
        raise AutotuneError(f"{len(latest)} studies of profile {profile!r} match: {labels}: "
                            "choose one with --model and --workload")
    return next(iter(latest.values()))


@dataclass(frozen=True)
class StudyView:
    """A stored study with the profile that ran it and its pooled candidates."""

    storage: Storage
    study: Study
    profile: MachineProfile
    candidates: list[select.Candidate]

    @property
    def name(self) -> str:
        """The study name."""
        return self.study.study_name

    @property
    def attrs(self) -> dict[str, Any]:
        """The study's user attributes (model, workload, objective, space...)."""
        return self.study.user_attrs

    @property
    def filters(self) -> str:
        """The command-line options that select this study again."""
        return (f"--profile {quote(self.profile.name)} --model {quote(model_stem(self.attrs))} "
                f"--workload {quote(self.attrs['workload']['name'])}")

    @property
    def objective(self) -> str:
        """The objective the study was run with."""
        return str(self.attrs.get("objective", objectives.DEFAULT))

    @property
    def asked(self) -> Asked:
        """The targets and memory ceiling its latest run stored: every pick of the study is made under them."""
        return Asked.of(self.attrs)

    def pick_among(self, among: Callable[[Any], bool] | None = None,
                   ceiling: int | None = None) -> select.Candidate | None:
        """The config the one decision rule names under the study's stored targets and ceiling (``ceiling``
        instead of the stored one when given), of those ``among`` accepts; None when none qualifies."""
        return self.asked.with_ceiling(ceiling).best(self.candidates, self.objective, among)

    def chosen(self, pick: str | None = None, ceiling: int | None = None,
               among: Callable[[Any], bool] | None = None) -> select.Candidate:
        """The recommended candidate (``pick``: one of the named picks instead), chosen under the study's
        stored targets and memory ceiling (``ceiling`` instead when given) among the configs ``among``
        accepts; AutotuneError naming the missed target, or the leanest config, when none qualifies."""
        if not self.candidates:
            raise AutotuneError(f"study {self.name} has no completed trial yet: run `autotune run` "
                                "with a larger --budget (the study resumes)")
        if pick is None:
            asked = self.asked.with_ceiling(ceiling)
            chosen = asked.best(self.candidates, self.objective, among)
            pool = [c for c in self.candidates if among is None or among(c)]
            fits = decision.within_ceiling(pool, asked.ceiling)
            if chosen is None and fits and asked.targets is not None and asked.targets.active:
                raise AutotuneError(asked.targets.miss_message(fits))
            if chosen is None and pool:
                lean = min(pool, key=lambda c: c.peak_rss)
                raise AutotuneError(
                    f"no measured config stays under the memory ceiling of {format_bytes(asked.ceiling or 0)}: "
                    f"the leanest, {backends.get(lean.backend).describe(lean.settings, lean.model)}, peaked at "
                    f"{format_bytes(lean.peak_rss)}; raise --memory-ceiling or search leaner settings")
            if chosen is None:
                raise AutotuneError(f"study {self.name} has no measured config of the asked backend")
            return chosen
        if pick not in decision.PICKS:
            raise AutotuneError(f"unknown pick {pick!r}: choose one of {', '.join(decision.PICKS)}")
        return decision.picks(self.candidates)[pick]

    def baseline(self, backend: str = backends.DEFAULT) -> select.Candidate | None:
        """The measured engine defaults of ``backend``."""
        return decision.baseline(self.candidates, backend)

    def recommendation(self, pick: str | None = None, ceiling: int | None = None) -> dict[str, Any]:
        """The recommendation document ``autotune run`` writes, for the best config (under ``ceiling``
        bytes of peak memory when given) or a pick."""
        chosen = self.chosen(pick, ceiling)
        extra = recommendation_extras(self.study, self.candidates, chosen, self.profile.bandwidth_for)
        if pick:
            extra["pick"] = pick
        extra.update(backends.health_sections(self.profile.extra))
        return recommend.build(profile=self.profile.public(), model=self.attrs["model"],
                               workload=self.attrs["workload"], objective=self.objective, study=self.name,
                               storage=redact(self.storage.url), chosen=chosen,
                               baseline=self.baseline(chosen.backend), extra=extra)


def load_view(storage: Storage, summary: Summary) -> StudyView:
    """Load the study of ``summary`` with its profile and candidates."""
    with storage.errors():
        study = load_study(storage, summary.study_name)
        cands = select.candidates(study)
    return StudyView(storage=storage, study=study, profile=storage.profile(study.user_attrs["profile_name"]),
                     candidates=cands)


def study_view(storage: Storage, profile: str | None = None, model: str | None = None,
               workload: str | None = None) -> StudyView:
    """The study a command reports on; ``profile`` defaults to this machine's profile name."""
    return load_view(storage, find_study(storage, profile or this_profile_name(), model, workload))


def profile_rows(storage: Storage) -> list[dict[str, Any]]:
    """One summary per stored profile: hardware, studies, trials and when it was last tuned."""
    with storage.errors():
        summaries = study_summaries(storage)
    rows = []
    for prof in storage.profiles():
        mine = [s for s in summaries if s.user_attrs.get("profile_name") == prof.name]
        rows.append({"name": prof.name, "id": prof.id, "cpu_model": prof.cpu_model, "cpus": prof.n_cpus,
                     "ram_gib": prof.ram_gib, "gpu": prof.gpu, "studies": len(mine),
                     "trials": sum(s.n_trials for s in mine),
                     "last_tuned": prof.extra.get("updated_at")})
    return rows


def _state(trial: FrozenTrial, rec: TrialRecord | None) -> tuple[str, str, str]:
    """(state, cause, detail): complete, failed (cause: signal, exit code or status), infeasible, running."""
    if rec is None:
        if trial.state == TrialState.RUNNING:
            return "running", "", ""
        if trial.state == TrialState.WAITING:
            return "queued", "", "queued; the next run measures it"
        return "failed", trial.state.name.lower(), "no autotune record"
    out = rec.outcome
    if out.status == REPEAT:
        return "repeat", "", out.reason
    if out.status in FAILED_STATUSES:
        return "failed", out.signal or (f"exit {out.exit_code}" if out.exit_code else out.status), out.reason
    if not rec.feasible:
        return "infeasible", out.status if out.status != OK else "constraint", rec.violation or out.reason
    if out.status == CUT:
        return "cut", "deadline", out.reason
    if out.status == PRUNED:
        return "pruned", "pruner", out.reason
    return "complete", "", ""


def trial_rows(study: Study) -> list[dict[str, Any]]:
    """Every trial of ``study`` as plain data, in trial order (fields documented in the README)."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        rec = record_of(trial)
        pending = trial.user_attrs.get(PENDING_ATTR, {})
        state, cause, detail = _state(trial, rec)
        rows.append({
            "number": trial.number, "role": rec.role if rec else pending.get("role", ""),
            "state": state, "status": rec.outcome.status if rec else trial.state.name.lower(),
            "cause": cause, "detail": detail, "settings": rec.settings if rec else pending.get("settings", {}),
            "config_key": rec.config_key if rec else pending.get("config_key", ""),
            "prefill_tps": rec.prefill.public() if rec and rec.prefill else None,
            "decode_tps": rec.decode.public() if rec and rec.decode else None,
            "decode_depth_tps": rec.decode_depth.public() if rec and rec.decode_depth else None,
            "depth": rec.extra.get("depth") if rec else None,
            "peak_rss_bytes": rec.outcome.memory.peak_rss if rec else None,
            "wall_s": rec.outcome.wall_s if rec else None, "notes": list(rec.notes) if rec else [],
        })
    return rows
