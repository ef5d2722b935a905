"""The ``autotune`` command line: thin click commands over the library, one module per command."""

from __future__ import annotations

import sys
from pathlib import Path
import warnings

import click

from ..errors import AutotuneError


class AutotuneGroup(click.Group):
    """A click group that turns :class:`AutotuneError` into one line and exit status 1."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except AutotuneError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("Interrupted: completed trials are saved; run the same command to resume.", err=True)
            sys.exit(130)


@click.group(cls=AutotuneGroup)
@click.version_option(package_name="autotune")
@click.option("--results", metavar="DIR", type=click.Path(file_okay=False), default=None,
              help="Results folder (database, recommendations, reports) instead of the user-level one "
                   "(AUTOTUNE_HOME or the platform's user data folder); also AUTOTUNE_RESULTS.")
def cli(results: str | None) -> None:
    """Find the fastest local LLM inference settings for this machine by measuring them."""
    if results:
        import os

        os.environ["AUTOTUNE_RESULTS"] = str(Path(results).resolve())  # children and the library read it
    from optuna.exceptions import ExperimentalWarning

    warnings.filterwarnings("ignore", category=ExperimentalWarning)


def _register() -> None:
    from . import run  # noqa: F401  (each module adds its command to the group)

    for name in ("profiles", "trials", "best", "export", "compare", "report", "check", "serve"):
        try:
            __import__(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise


_register()


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="autotune")
