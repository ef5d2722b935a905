"""Atomic writes leave the old file or the new one, never a temporary; versioned files check and upgrade."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import AutotuneError
from tuner.util.files import (VersionedFormat, atomic_write_bytes, atomic_write_text, remove_stale_temps,
                         temp_sibling, write_json)


def test_atomic_write_makes_folders_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.txt"
    assert atomic_write_text(target, "first ü") == target
    atomic_write_text(target, "second", fsync=True)
    assert target.read_text(encoding="utf-8") == "second"
    write_json(tmp_path / "data.json", {"x": [1, 2]})
    assert json.loads((tmp_path / "data.json").read_text()) == {"x": [1, 2]}
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["data.json", "out.txt"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()  # a folder where the file should go: the rename fails
    with pytest.raises(AutotuneError):  # an OSError, worded as one line
        atomic_write_bytes(target, b"data")
    assert target.is_dir() and list(tmp_path.iterdir()) == [target]


def test_temp_sibling_and_stale_temporaries(tmp_path: Path) -> None:
    target = tmp_path / "model.gguf"
    with temp_sibling(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".model.gguf.tmp") and not tmp.exists()
        tmp.write_bytes(b"half")
    assert not tmp.exists()
    (tmp_path / ".model.gguf.tmp4242").write_bytes(b"left by a killed process")
    (tmp_path / "other.gguf").write_bytes(b"kept")
    assert remove_stale_temps(target) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["other.gguf"]


FMT = VersionedFormat("demo", 2, "autotune demo",
                      {0: lambda d: {**d, "version": 1, "a": d.get("a", 0)},
                       1: lambda d: {**d, "version": 2, "b": d["a"] + 1}})


def test_versioned_format_stamps_and_upgrades_step_by_step() -> None:
    assert list(FMT.stamp({"x": 1, "version": 9})) == ["format", "version", "x"]
    assert FMT.stamp({"x": 1})["version"] == 2
    assert FMT.check({"version": 0, "a": 4}, "f") == {"version": 2, "a": 4, "b": 5}  # no format key: taken as this one
    assert FMT.check({"format": "demo", "version": 2}, "f") == {"format": "demo", "version": 2}


@pytest.mark.parametrize("doc, message", [
    ({"format": "demo", "version": 3}, "f has format version 3, newer than this autotune reads (2): upgrade autotune"),
    ({"format": "other", "version": 1}, "f is not an autotune demo file"),
    ([1, 2], "f is not an autotune demo file"),
    ({"format": "demo"}, "f has no format version: is it an autotune demo?"),
    ({"version": -1}, "f has format version -1, older than this autotune can read (2)"),
])
def test_versioned_format_refuses(doc: object, message: str) -> None:
    with pytest.raises(AutotuneError) as err:
        FMT.check(doc, "f")
    assert message in str(err.value)


def test_recommendation_messages_are_kept_word_for_word() -> None:
    from tuner.recommend.document import upgrade

    for doc, message in (({"format": "x", "version": 1}, "r.yaml is not an autotune recommendation file"),
                         ({"settings": {}}, "r.yaml has no format version: is it an autotune recommendation?")):
        with pytest.raises(AutotuneError) as err:
            upgrade(doc, "r.yaml")
        assert str(err.value) == message
    assert upgrade({"version": 0, "config": {"n_threads": 2}}, "r.yaml")["settings"] == {"n_threads": 2}
