"""Option bundles shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..errors import AutotuneError


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


def parse_cpus(text: str | None) -> list[int] | None:
    """``0,2-3`` -> [0, 2, 3]; an empty list or CPUs this process may not use are one line."""
    if text is None:
        return None
    import os

    if not text.strip():
        raise AutotuneError("--cpus is empty: give CPUs like 0 or 0-3 or 0,2, or leave the option out")
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise AutotuneError(f"cannot read the CPU list {text[:40]!r}: write it like 0 or 0-3 or 0,2") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise AutotuneError(f"--cpus {text[:40]} names CPUs this process cannot use: choose among "
                            f"{min(allowed)}-{max(allowed)} ({len(allowed)} CPUs)")
    return sorted(cpus)
