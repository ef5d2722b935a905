"""Option bundles shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def storage_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--storage URL``: the database (default: SQLite in the results folder)."""
    return click.option("--storage", metavar="URL", envvar="AUTOTUNE_STORAGE",
                        help="Database URL (default: SQLite autotune.db in the results folder; "
                             "postgresql://user@host/db for several workers).")(func)


def study_filter_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--profile``, ``--model`` and ``--workload`` filters that pick a study."""
    func = click.option("--workload", metavar="NAME", help="Workload name (default: any).")(func)
    func = click.option("--model", "model", metavar="NAME",
                        help="Model file name, stem or sha256 prefix (default: any).")(func)
    func = click.option("--profile", metavar="NAME", help="Machine profile name (default: this machine's).")(func)
    return func
