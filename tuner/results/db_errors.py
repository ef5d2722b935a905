"""What a database failure means, in one line with the next step: a locked SQLite file, a full disk,
a damaged file (with SQLite's own integrity check), an unreachable server."""

from __future__ import annotations

import contextlib
import os

from sqlalchemy.engine import make_url


def redact(url: str) -> str:
    """``url`` with its password hidden, for messages and files."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown as given
        return url


def describe(exc: BaseException) -> str:
    text = " ".join(str(getattr(exc, "orig", None) or exc).split())
    return text[:200]


def db_error_message(exc: BaseException, url: str) -> str:
    """A one-line, actionable message for a database failure: what happened (locked, full disk, a
    corrupt file with SQLite's own integrity check, an unreachable server) and what to do next."""
    text = describe(exc)
    low = text.lower()
    sqlite_path = _sqlite_path(url)
    if "database is locked" in low:
        return (f"the SQLite database {redact(url)} is locked by another autotune process: "
                "SQLite is for one worker; for several workers use --storage postgresql://...")
    if "disk is full" in low or "no space left" in low or "database or disk is full" in low:
        where = os.path.dirname(sqlite_path) if sqlite_path else "the database server"
        return (f"the disk holding {where} is full, so the database {redact(url)} cannot be written ({text}): "
                "free some space and run the same command again (the study resumes)")
    if sqlite_path and any(s in low for s in ("malformed", "not a database", "corrupt", "exceeding max length",
                                              "invalid data", "file is encrypted")):
        return (f"the SQLite file {sqlite_path} is damaged ({text}; integrity check: {_integrity(sqlite_path)}): "
                "move it aside and run again, or recover it with `sqlite3 FILE .recover`")
    if sqlite_path:
        return f"the SQLite database {sqlite_path} failed ({text}): check the file and the folder it is in"
    return f"the database {redact(url)} failed ({text}): check that the server is running and reachable"


def _sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL (None for another database or an in-memory one)."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return os.path.abspath(parsed.database)


def _integrity(path: str) -> str:
    """SQLite's own ``PRAGMA integrity_check`` of ``path``, first line (or why it could not run)."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2)) as db:
            rows = db.execute("PRAGMA integrity_check").fetchmany(3)
        return "; ".join(str(r[0]) for r in rows)[:160] or "no answer"
    except sqlite3.Error as exc:
        return f"could not run: {exc}"
