"""The ``autotune`` click group: every command module adds its command to it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ..errors import AutotuneError
from ..results.storage import quiet_optuna_warnings


MAX_ERROR_CHARS = 600  # an error is one line a person reads, not a dump of a value


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` on one line, cut in the middle past ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else f"{flat[:limit // 2]} ... {flat[-limit // 2:]}"


class AutotuneGroup(click.Group):
    """A click group that turns :class:`AutotuneError` into one line and exit status 1."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except AutotuneError as exc:
            click.echo(f"Error: {one_line(str(exc))}", err=True)
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
        os.environ["AUTOTUNE_RESULTS"] = str(Path(results).resolve())  # children and the library read it

    quiet_optuna_warnings()
