"""The read-only commands work on a results database this process cannot write (issue 27, item 10): a
read-only folder or file (on a mounted snapshot, a shared read-only share, an immutable file)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixtures.invented import invented_db  # noqa: F401  (a fixture)
from sqlalchemy.engine import make_url
from fault_tally import counted

from tuner.cli import cli
from tuner.results import readonly


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@counted("a read-only results folder")
def test_read_only_commands_read_a_database_in_a_read_only_folder(invented_db: str, tmp_path: Path,  # noqa: F811
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "autotune.db"
    shutil.copy(make_url(invented_db).database, db)
    before = _digest(db)
    db.chmod(stat.S_IRUSR | stat.S_IRGRP)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.geteuid() == 0:  # root passes every permission check: have autotune see what a user would
        monkeypatch.setattr(readonly, "writable", lambda path: False)
    opened: list[Path] = []
    real_open = readonly.open_read_only
    monkeypatch.setattr(readonly, "open_read_only", lambda path, url: opened.append(path) or real_open(path, url))
    try:
        url = f"sqlite:///{db}"
        for args in (["profiles"], ["trials", "--profile", "laptop-4c"], ["best", "--profile", "laptop-4c"],
                     ["export", "--profile", "laptop-4c", "--format", "json"]):
            result = CliRunner().invoke(cli, [*args, "--storage", url])
            assert result.exit_code == 0, (args, result.output)
        assert _digest(db) == before and sorted(p.name for p in folder.iterdir()) == ["autotune.db"]
        assert opened == [db] * 4   # each command opened it in SQLite's read-only mode
    finally:
        folder.chmod(stat.S_IRWXU)
        db.chmod(stat.S_IRUSR | stat.S_IWUSR)


def test_a_read_only_database_is_opened_with_sqlites_read_only_mode(invented_db: str, tmp_path: Path) -> None:  # noqa: F811
    # Whatever the process's rights, the storage opened here cannot write: SQLite refuses it.
    db = tmp_path / "autotune.db"
    shutil.copy(make_url(invented_db).database, db)
    storage = readonly.open_read_only(db, f"sqlite:///{db}")
    assert storage.profiles()
    with pytest.raises(Exception, match="readonly database"):
        with storage.engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE x (a INTEGER)")


@counted("a report into a folder that cannot be made")
def test_a_report_into_a_folder_that_cannot_be_made_is_one_line(invented_db: str, tmp_path: Path) -> None:  # noqa: F811
    # The report's folder (its profile's subfolder by default) is made as it is written: where that
    # cannot be (a file stands on the path; a read-only results folder for a user), one line, no traceback.
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    result = CliRunner().invoke(cli, ["report", "--profile", "laptop-4c", "--storage", invented_db, "--no-images",
                                      "-o", str(blocker / "laptop-4c" / "report.html")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (result.output, result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "report folder" in lines[0] and "-o" in lines[0], result.output
