"""Writing files so that a reader never sees half of one.

Every file autotune writes (recommendations, exports, reports, caches, a trial child's result)
goes through :func:`atomic_write_bytes`: the bytes go to a temporary file in the same folder,
which is then renamed over the target, so a concurrent reader sees the old file or the new
one, never an empty or cut one.

Only the standard library is imported here: a trial's child process uses this module too.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TEMP_MARK = ".tmp"  # temporary files are ".<name>.tmp<pid>-<random>" next to their target


def temp_path(path: Path | str) -> Path:
    """A unique, hidden temporary name in ``path``'s folder (nothing is created)."""
    path = Path(path)
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


@contextlib.contextmanager
def temp_sibling(path: Path | str) -> Iterator[Path]:
    """A :func:`temp_path` for ``path``, removed when the block ends unless it was renamed away.

    For a file another program writes (e.g. llama.cpp's quantizer): write the yielded path,
    then ``os.replace`` it over ``path`` inside the block once it is complete.
    """
    tmp = temp_path(path)
    try:
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def remove_stale_temps(path: Path | str) -> int:
    """Delete temporary files left next to ``path`` by processes killed mid-write; how many.

    Only safe while no other process may be writing ``path`` (under a lock).
    """
    path = Path(path)
    removed = 0
    for stale in path.parent.glob(f".{path.name}{TEMP_MARK}*"):
        with contextlib.suppress(OSError):
            stale.unlink()
            removed += 1
    return removed


def atomic_write_bytes(path: Path | str, data: bytes, *, fsync: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, then a rename.

    Missing parent folders are made. ``fsync`` also flushes the file to disk before the
    rename (it survives a power cut, at the cost of a disk flush). On any failure the
    temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with temp_sibling(path) as tmp:
        with open(tmp, "xb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    return path


def atomic_write_text(path: Path | str, text: str, *, fsync: bool = False) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    return atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


def write_json(path: Path | str, data: Any, *, indent: int | None = 1) -> Path:
    """Write ``data`` as JSON to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    return atomic_write_text(path, json.dumps(data, indent=indent))
