"""Where autotune keeps its files.

One user-level home, found from any folder: ``AUTOTUNE_HOME`` or else
``platformdirs.user_data_dir("autotune")`` (``~/.local/share/autotune`` on Linux); the results
(database, recommendations, reports) live in its ``results/`` folder, so ``autotune run`` in one
folder and ``tuner.autoconfig()`` in an application started in another see the same database.
``AUTOTUNE_RESULTS`` (the CLI's ``--results``) points the results folder somewhere else, a
project-local ``results/`` for one; ``AUTOTUNE_STORAGE`` names the database itself;
``AUTOTUNE_CACHE_DIR`` moves derived model files. Tests and CI set these to temporary folders so
they never touch a user's data. Programs autotune builds once per version (llama.cpp's ``llama-server``)
go to the user's cache folder (:func:`user_cache_dir`), shared by every results folder.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from ..errors import AutotuneError

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def _search_spaces_dir() -> Path:
    """The shipped spaces: the installed package data, or the checkout's folder when run from source."""
    try:
        from .. import search_spaces  # type: ignore[attr-defined]  # optional: the installed package data only
    except ImportError:
        return PROJECT_ROOT / "search_spaces"
    return Path(search_spaces.__file__).resolve().parent


SEARCH_SPACES_DIR = _search_spaces_dir()


def home_dir() -> Path:
    """autotune's user-level folder: ``AUTOTUNE_HOME``, else the platform's user data folder."""
    env = os.environ.get("AUTOTUNE_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("autotune", appauthor=False))


def results_dir() -> Path:
    """The folder for the default database, recommendations and reports (an absolute path).

    ``AUTOTUNE_RESULTS`` when set (a project-local folder), else ``results/`` in :func:`home_dir`.
    """
    env = os.environ.get("AUTOTUNE_RESULTS")
    return Path(env).expanduser().resolve() if env else home_dir() / "results"


def cache_dir() -> Path:
    """The folder for derived files that are costly to make (quantized model variants)."""
    env = os.environ.get("AUTOTUNE_CACHE_DIR")
    return Path(env) if env else results_dir() / "cache"


def user_cache_dir() -> Path:
    """The user's cache folder for programs autotune builds once per version (``llama-server``):
    ``$XDG_CACHE_HOME/autotune``, else ``~/.cache/autotune`` on Linux (the platform's user cache folder
    elsewhere). Unlike :func:`cache_dir` it follows no results folder: every run on the machine shares it."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("autotune", appauthor=False))


def writable_dir(path: Path, what: str, fix: str) -> Path:
    """``path`` as a folder autotune can write (made if missing); one AutotuneError saying ``fix`` otherwise."""
    if path.exists() and not path.is_dir():
        raise AutotuneError(f"the {what} {path} is a file, not a folder: {fix}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = "a file stands where a folder belongs" if isinstance(exc, (FileExistsError, NotADirectoryError)) \
            else exc.strerror
        raise AutotuneError(f"cannot make the {what} {path} ({reason}): {fix}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise AutotuneError(f"the {what} {path} is not writable: {fix}")
    return path


def check_locations() -> None:
    """The results and cache folders exist (or can be made) and can be written; one line otherwise."""
    writable_dir(results_dir(), "results folder", "set AUTOTUNE_RESULTS to a folder you can write")
    writable_dir(cache_dir(), "cache folder", "set AUTOTUNE_CACHE_DIR (or AUTOTUNE_RESULTS) to a folder you can write")


def default_storage_url() -> str:
    """``AUTOTUNE_STORAGE`` when set, else the SQLite database inside the results folder."""
    return os.environ.get("AUTOTUNE_STORAGE") or f"sqlite:///{(results_dir() / 'autotune.db').resolve()}"


def machine_lock_path() -> Path:
    """The lock that keeps two trials from running on this machine at the same time."""
    env = os.environ.get("AUTOTUNE_MACHINE_LOCK")
    return Path(env) if env else Path(tempfile.gettempdir()) / "autotune-machine.lock"


def slug(text: str) -> str:
    """A file-name-safe lower-case version of ``text``."""
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-") or "unnamed"
