"""The ``autotune`` command line: thin click commands over the library, one module per command."""

from __future__ import annotations

from . import run  # noqa: F401 - each command module adds its command to the group
from .group import AutotuneGroup, cli

__all__ = ["AutotuneGroup", "cli", "main"]


def _register() -> None:
    """Add the other commands to the group (a command module a trimmed install lacks is left out)."""
    for name in ("profiles", "trials", "best", "export", "compare", "report", "check", "serve", "build_server"):
        try:
            __import__(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise


_register()


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="autotune")
