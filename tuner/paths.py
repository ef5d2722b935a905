"""Where autotune keeps its files.

``AUTOTUNE_RESULTS`` points the results folder (database, recommendations, reports)
somewhere else; ``AUTOTUNE_CACHE_DIR`` does the same for derived model files. Tests
set both to temporary folders so they never touch a user's data.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = Path(__file__).resolve().parent / "data"


def _search_spaces_dir() -> Path:
    """The shipped spaces: the installed package data, or the checkout's folder when run from source."""
    try:
        from . import search_spaces  # type: ignore[attr-defined]  # mapped from ./search_spaces
    except ImportError:
        return PROJECT_ROOT / "search_spaces"
    return Path(search_spaces.__file__).resolve().parent


SEARCH_SPACES_DIR = _search_spaces_dir()


def results_dir() -> Path:
    """The folder for the default database, recommendations and reports."""
    return Path(os.environ.get("AUTOTUNE_RESULTS", "results"))


def cache_dir() -> Path:
    """The folder for derived files that are costly to make (quantized model variants)."""
    env = os.environ.get("AUTOTUNE_CACHE_DIR")
    return Path(env) if env else results_dir() / "cache"


def default_storage_url() -> str:
    """SQLite database inside the results folder."""
    return f"sqlite:///{(results_dir() / 'autotune.db').resolve()}"


def machine_lock_path() -> Path:
    """The lock that keeps two trials from running on this machine at the same time."""
    env = os.environ.get("AUTOTUNE_MACHINE_LOCK")
    return Path(env) if env else Path(tempfile.gettempdir()) / "autotune-machine.lock"


def slug(text: str) -> str:
    """A file-name-safe lower-case version of ``text``."""
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-") or "unnamed"
