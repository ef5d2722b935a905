"""Writing files so that a reader never sees half of one, and files that carry a format version.

Every file autotune writes (recommendations, exports, reports, caches, a trial child's result)
goes through :func:`atomic_write_bytes`: the bytes go to a temporary file in the same folder,
which is then renamed over the target, so a concurrent reader sees the old file or the new
one, never an empty or cut one. A file whose layout may change carries a format name and
version, checked and upgraded on reading by a :class:`VersionedFormat`.

Only the standard library is imported here: a trial's child process uses this module too.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import AutotuneError
from .processes import alive

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


def remove_orphan_temps(folder: Path | str) -> list[Path]:
    """Delete the temporary files under ``folder`` whose writing process is gone (a quantizer or an
    autotune killed mid-write leaves a file as large as a model); the paths removed."""
    removed = []
    for stale in Path(folder).rglob(f".*{TEMP_MARK}*"):
        pid = stale.name.rsplit(TEMP_MARK, 1)[-1].split("-", 1)[0]
        if not pid.isdigit() or alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            stale.unlink()
            removed.append(stale)
    return removed


def atomic_write_bytes(path: Path | str, data: bytes, *, fsync: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, then a rename.

    Missing parent folders are made. ``fsync`` also flushes the file to disk before the
    rename (it survives a power cut, at the cost of a disk flush). On any failure the
    temporary file is removed, ``path`` is left as it was, and the reason is one
    :class:`AutotuneError` naming the path (not writable, a file where a folder belongs, a
    folder where the file belongs, disk full).
    """
    path = Path(path)
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "it is a folder, give a file name")
        path.parent.mkdir(parents=True, exist_ok=True)
        with temp_sibling(path) as tmp:
            with open(tmp, "xb") as fh:
                fh.write(data)
                if fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, path)
    except OSError as exc:
        raise AutotuneError(f"cannot write {path} ({_why(exc)}): choose another place") from None
    return path


def _why(exc: OSError) -> str:
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        return "a file stands where a folder belongs on that path"
    return exc.strerror or type(exc).__name__


def atomic_write_text(path: Path | str, text: str, *, fsync: bool = False) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    return atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


def write_json(path: Path | str, data: Any, *, indent: int | None = 1) -> Path:
    """Write ``data`` as JSON to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    return atomic_write_text(path, json.dumps(data, indent=indent))


Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class VersionedFormat:
    """A file format with a name and a version number, written in its ``format`` and ``version`` keys.

    ``upgrades[v]`` turns a version-``v`` document into version ``v + 1``; ``title`` names the
    format in messages ("autotune recommendation"). A document without a ``format`` key is
    taken to be of this format (files written before the key existed).
    """

    name: str
    version: int
    title: str
    upgrades: Mapping[int, Upgrade] = field(default_factory=dict)

    def stamp(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """``doc`` with this format's name and current version as its first keys."""
        return {"format": self.name, "version": self.version,
                **{k: v for k, v in doc.items() if k not in ("format", "version")}}

    def check(self, doc: Any, where: str) -> dict[str, Any]:
        """``doc`` (read from ``where``) brought to the current version, step by step.

        Raises AutotuneError for a document of another format or without a version, for a
        version newer than this autotune reads (upgrade autotune), and for an old version
        that no upgrade step leads on from.
        """
        if not isinstance(doc, dict) or doc.get("format", self.name) != self.name:
            raise AutotuneError(f"{where} is not an {self.title} file")
        version = doc.get("version")
        if not isinstance(version, int):
            raise AutotuneError(f"{where} has no format version: is it an {self.title}?")
        if version > self.version:
            raise AutotuneError(f"{where} has format version {version}, newer than this autotune reads "
                                f"({self.version}): upgrade autotune")
        while version < self.version:
            if version not in self.upgrades:
                raise AutotuneError(f"{where} has format version {version}, older than this autotune "
                                    f"can read ({self.version}): write it again")
            doc = self.upgrades[version](doc)
            version = doc["version"]
        return doc
