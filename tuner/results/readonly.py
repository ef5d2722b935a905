"""A results database this process may read but not write: a read-only (or immutable) SQLite file or folder.

``autotune trials``, ``best``, ``export``, ``compare``, ``report`` and ``check`` only read. Opening a
database normally creates missing tables, runs migrations and keeps a heartbeat, all writes; here the
file is opened with SQLite's own read-only mode (``mode=ro``, and ``immutable=1`` when its folder cannot
be written either, so SQLite does not look for a journal it could not make), Optuna is told not to create
tables, and a database whose schema would need a migration is refused in one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

import optuna
import sqlalchemy as sa

from ..errors import AutotuneError
from .db_errors import db_error_message
from .storage import SCHEMA_VERSION, SCHEMA_VERSION_KEY, Storage, meta_table


def writable(db_path: Path) -> bool:
    """Whether a writer could use the SQLite file at ``db_path``: the file and its folder writable."""
    return os.access(db_path.parent, os.W_OK | os.X_OK) and os.access(db_path, os.W_OK)


def open_read_only(db_path: Path, url: str) -> Storage:
    """The SQLite results file at ``db_path`` (named ``url`` to the user), opened for reading only."""
    if not os.access(db_path, os.R_OK):
        raise AutotuneError(f"the SQLite database {db_path} cannot be read: check its permissions, or pass --storage")
    immutable = "&immutable=1" if not os.access(db_path.parent, os.W_OK | os.X_OK) else ""
    engine_url = f"sqlite:///file:{quote(str(db_path.resolve()))}?mode=ro{immutable}&uri=true"
    try:
        rdb = optuna.storages.RDBStorage(engine_url, skip_table_creation=True,
                                         engine_kwargs={"connect_args": {"timeout": 60}})
        with rdb.engine.connect() as conn:
            row = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == SCHEMA_VERSION_KEY)).first()
    except Exception as exc:  # noqa: BLE001 - every failure to open gets one message
        raise AutotuneError(db_error_message(exc, url)) from exc
    current = int(row[0]) if row else 0
    if current != SCHEMA_VERSION:
        raise AutotuneError(f"the database {db_path} is read-only here and its schema ({current}) needs "
                            f"autotune's migration to {SCHEMA_VERSION}, which writes: copy it to a folder you can "
                            "write and pass --storage sqlite:///COPY")
    return Storage(url, rdb)
