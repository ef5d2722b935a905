"""The database behind autotune: Optuna's RDB storage plus autotune's own small tables.

Optuna owns studies and trials. autotune adds a ``autotune_meta`` table (its own schema
version) and ``autotune_profiles`` (machine profiles by name), created by an ordered list
of migrations. Every database failure is turned into one :class:`AutotuneError` that says
what to check.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ..errors import AutotuneError
from .db_errors import db_error_message, describe as _describe, redact
from ..util.paths import default_storage_url, results_dir, writable_dir
from ..machine.profile import MachineProfile

SCHEMA_VERSION_KEY = "schema_version"
HEARTBEAT_INTERVAL_S = 5
DEFAULT_GRACE_PERIOD_S = 30

_metadata = sa.MetaData()
meta_table = sa.Table("autotune_meta", _metadata,
                      sa.Column("key", sa.String(64), primary_key=True),
                      sa.Column("value", sa.Text, nullable=False))
profiles_table = sa.Table("autotune_profiles", _metadata,
                          sa.Column("name", sa.String(200), primary_key=True),
                          sa.Column("id", sa.String(32), nullable=False, index=True),
                          sa.Column("facts", sa.Text, nullable=False),
                          sa.Column("created_at", sa.String(32), nullable=False),
                          sa.Column("updated_at", sa.String(32), nullable=False))


def _m001_create_tables(conn: sa.Connection) -> None:
    _metadata.create_all(conn, checkfirst=True)


# Schema migrations, in order; the schema version is the number applied.
MIGRATIONS: list[Callable[[sa.Connection], None]] = [_m001_create_tables]
SCHEMA_VERSION = len(MIGRATIONS)


def _grace_period() -> int:
    return int(os.environ.get("AUTOTUNE_HEARTBEAT_GRACE", DEFAULT_GRACE_PERIOD_S))


class Storage:
    """An open autotune database: the Optuna storage and the profile table."""

    def __init__(self, url: str, rdb: optuna.storages.RDBStorage):
        self.url = url
        self.rdb = rdb
        self.engine: sa.Engine = rdb.engine

    @property
    def is_sqlite(self) -> bool:
        """Whether this is an embedded SQLite file (one worker at a time)."""
        return self.url.startswith("sqlite")

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Turn database errors inside the block into :class:`AutotuneError`."""
        try:
            yield
        except (sa.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
            raise AutotuneError(db_error_message(exc, self.url)) from exc

    # Optuna keeps the ids that its storage API takes private (``Trial._trial_id``,
    # ``Study._study_id``, ``RDBStorage._get_stale_trial_ids``): the methods below are the only
    # places autotune touches them, and tests/test_storage_api.py checks them on every upgrade.

    @staticmethod
    def trial_id(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
        """The storage's id of ``trial`` (unique in the database, unlike ``trial.number``)."""
        return trial._trial_id

    @staticmethod
    def study_id(study: optuna.Study | optuna.study.StudySummary) -> int:
        """The storage's id of a study or study summary: increasing in creation order."""
        return study._study_id

    def heartbeat(self, trial: optuna.Trial | optuna.trial.FrozenTrial) -> None:
        """Record that ``trial``'s worker is alive (see :meth:`stale_trial_ids`)."""
        with self.errors():
            self.rdb.record_heartbeat(self.trial_id(trial))

    def stale_trial_ids(self, study: optuna.Study) -> set[int]:
        """Ids of ``study``'s RUNNING trials whose last heartbeat is older than the grace period."""
        with self.errors():
            return set(self.rdb._get_stale_trial_ids(self.study_id(study)))

    def fail_trial(self, trial_id: int, user_attrs: dict[str, Any]) -> bool:
        """Set ``user_attrs`` on a running trial and its state to FAIL.

        Returns False, changing nothing further, when the trial has finished meanwhile (its
        worker told it, or another worker failed it first).
        """
        try:
            with self.errors():
                for name, value in user_attrs.items():
                    self.rdb.set_trial_user_attr(trial_id, name, value)
                self.rdb.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        return True

    def schema_version(self) -> int:
        """The autotune schema version stored in the database."""
        with self.errors(), self.engine.connect() as conn:
            row = conn.execute(sa.select(meta_table.c.value).where(
                meta_table.c.key == SCHEMA_VERSION_KEY)).first()
        return int(row[0]) if row else 0

    def save_profile(self, profile: MachineProfile) -> None:
        """Store ``profile`` under its name; a name already used by another machine is refused.

        Two workers of a fleet inserting the same new name at once: the loser of the race
        reads the winner's row and updates it instead.
        """
        with self.errors():
            try:
                self._save_profile(profile)
            except sa.exc.IntegrityError:
                self._save_profile(profile)

    def _save_profile(self, profile: MachineProfile) -> None:
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(profiles_table.c.id).where(
                profiles_table.c.name == profile.name)).first()
            facts = json.dumps(profile.public(), sort_keys=True)
            if row is None:
                conn.execute(profiles_table.insert().values(
                    name=profile.name, id=profile.id, facts=facts, created_at=now, updated_at=now))
            elif row[0] != profile.id:
                raise AutotuneError(
                    f"profile name {profile.name!r} already belongs to another machine kind "
                    f"(id {row[0]}, this one is {profile.id}): choose another --profile NAME")
            else:
                conn.execute(profiles_table.update().where(profiles_table.c.name == profile.name)
                             .values(facts=facts, updated_at=now))

    def profiles(self) -> list[MachineProfile]:
        """Every stored profile, by name."""
        with self.errors(), self.engine.connect() as conn:
            rows = conn.execute(sa.select(profiles_table.c.facts, profiles_table.c.updated_at)
                                .order_by(profiles_table.c.name)).all()
        out = []
        for facts, updated in rows:
            data = json.loads(facts)
            data.setdefault("extra", {})["updated_at"] = updated
            out.append(MachineProfile.from_dict(data))
        return out

    def profile(self, name: str) -> MachineProfile:
        """The stored profile called ``name``; an unknown name lists the known ones."""
        for prof in self.profiles():
            if prof.name == name:
                return prof
        known = ", ".join(p.name for p in self.profiles()) or "none yet: run `autotune run` first"
        raise AutotuneError(f"unknown profile {name!r}: known profiles are {known}")


def _migrate(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        meta_table.create(conn, checkfirst=True)
        row = conn.execute(sa.select(meta_table.c.value).where(
            meta_table.c.key == SCHEMA_VERSION_KEY)).first()
        current = int(row[0]) if row else 0
        if current > SCHEMA_VERSION:
            raise AutotuneError(f"the database was written by a newer autotune (schema {current}, "
                                f"this one knows {SCHEMA_VERSION}): upgrade autotune")
        for migration in MIGRATIONS[current:]:
            migration(conn)
        if row is None:
            conn.execute(meta_table.insert().values(key=SCHEMA_VERSION_KEY, value=str(SCHEMA_VERSION)))
        elif current != SCHEMA_VERSION:
            conn.execute(meta_table.update().where(meta_table.c.key == SCHEMA_VERSION_KEY)
                         .values(value=str(SCHEMA_VERSION)))


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        # Wait for a competing writer instead of failing at once with "database is locked".
        return {"connect_args": {"timeout": 60}}
    return {"pool_pre_ping": True, "pool_recycle": 1800}


def _existing_folder(folder: Path, db_path: str) -> None:
    """A database is made in a folder that exists (autotune's own results folder apart, which it makes): a
    mistyped ``--storage`` path must not make folders wherever it points (at ``/`` when run as root)."""
    if os.path.lexists(folder) or folder.resolve() == results_dir().resolve():
        return
    raise AutotuneError(f"the folder {folder} of the database {db_path} does not exist: make it first, or pass "
                        "--storage (or AUTOTUNE_STORAGE) with a SQLite file in a folder that exists")


def open_storage(url: str | None = None, attempts: int = 6) -> Storage:
    """Open (creating if needed) the database at ``url``; default: SQLite in the results folder.

    Several workers creating the schema of a fresh database at the same moment race on
    Optuna's Alembic table; a failed creation is retried after a short random pause.
    """
    url = url or default_storage_url()
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001
        raise AutotuneError(f"cannot read the storage URL {url!r}: write it like "
                            "sqlite:///results/autotune.db or postgresql://user@host/db") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        db_path = os.path.abspath(parsed.database)
        if os.path.isdir(db_path):
            raise AutotuneError(f"the SQLite path {db_path} is a folder: give a file name")
        _existing_folder(Path(db_path).parent, db_path)
        writable_dir(Path(db_path).parent, "database folder", "pass --storage (or AUTOTUNE_STORAGE) with a "
                     "SQLite file in a folder you can write, or set AUTOTUNE_RESULTS")
        if os.path.exists(db_path) and not os.access(db_path, os.R_OK | os.W_OK):
            raise AutotuneError(f"the SQLite database {db_path} is not readable and writable: pass --storage "
                                "with another file")
    engine_url = url
    if parsed.drivername == "postgresql":
        # psycopg 3 is the driver autotune installs; SQLAlchemy 2.0 would pick psycopg2 here.
        engine_url = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    last: BaseException | None = None
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():  # heartbeats are "experimental": not an application's concern
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                rdb = optuna.storages.RDBStorage(
                    engine_url, engine_kwargs=_engine_kwargs(url), heartbeat_interval=HEARTBEAT_INTERVAL_S,
                    grace_period=_grace_period())
            _migrate(rdb.engine)
            return Storage(url, rdb)
        except AutotuneError:
            raise
        except ModuleNotFoundError as exc:
            raise AutotuneError(f"no database driver for {redact(url)} ({exc.name}): "
                                "install it, e.g. pip install 'psycopg[binary]'") from None
        except Exception as exc:  # noqa: BLE001 - every failure to open gets one message
            last = exc
            text = _describe(exc)
            if any(s in text for s in ("already exists", "duplicate key", "database is locked",
                                       "UniqueViolation", "UNIQUE constraint failed", "deadlock")):
                time.sleep(0.2 + random.random() * (attempt + 1))
                continue
            break
    raise AutotuneError(db_error_message(last, url)) from last  # type: ignore[arg-type]


def quiet_optuna_warnings() -> None:
    """Hide Optuna's ExperimentalWarning (the heartbeat and constraint features autotune relies on are marked
    experimental; the CLI should not print that on every run)."""
    import warnings

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def asked_params(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The params a trial asked for: a queued trial's (Optuna keeps ``enqueue_trial``'s params in the private
    system attribute ``fixed_params``), else its params. The one place outside Optuna that reads it."""
    return trial.system_attrs.get("fixed_params") or trial.params
