"""``autotune check``."""

from __future__ import annotations

import click

from ..errors import AutotuneError
from ..util.units import parse_fraction
from .group import cli
from .options import storage_option, study_filter_options
from ..recommend.check import check as run_check
from ..recommend.query import open_results, study_view


@cli.command()
@click.argument("recommendation", required=False, type=click.Path(dir_okay=False))
@study_filter_options
@storage_option
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(1, 20),
              help="Interleaved rounds of the recommendation and its baseline.")
@click.option("--repetitions", default=3, show_default=True, type=click.IntRange(1, 50),
              help="Timed repetitions per trial.")
@click.option("--tolerance", metavar="PCT", help="How much slower than stored still holds, e.g. 15% "
              "(default: 3x the stored spread, at least 10%).")
def check(recommendation: str | None, profile: str | None, model: str | None, workload: str | None,
          storage: str | None, rounds: int, repetitions: int, tolerance: str | None) -> None:
    """Re-measure a stored recommendation against its baseline on this machine now.

    Exits 0 while the recommendation still beats the engine's defaults and sits within its stored
    figures' spread (or --tolerance), and 1 with a one-line reason otherwise: a regression check for
    CI after an upgrade. RECOMMENDATION is a recommendation file; without it, the study of this
    machine's profile in the database is checked.
    """
    if recommendation:
        if profile or model or workload:
            raise AutotuneError("give a RECOMMENDATION file or --profile/--model/--workload, not both")
        source = recommendation
    else:
        source = study_view(open_results(storage), profile, model, workload).recommendation()
    result = run_check(source, rounds=rounds, repetitions=repetitions,
                       tolerance=parse_fraction(tolerance, "--tolerance") if tolerance else None,
                       on_status=lambda text: click.echo(f"  {text}", err=True))
    for role, figures in result.now.items():
        shown = ", ".join(f"{k} {v:.2f}" for k, v in figures.items())
        click.echo(f"{role:<12} now: {shown or 'no figures'}")
    if not result.ok:
        raise AutotuneError(result.reason)
    click.echo(result.reason)
