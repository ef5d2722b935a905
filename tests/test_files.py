"""Atomic writes leave the old file or the new one, never a temporary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.files import atomic_write_bytes, atomic_write_text, remove_stale_temps, temp_sibling, write_json


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
    with pytest.raises(OSError):
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
