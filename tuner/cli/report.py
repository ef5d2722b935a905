"""``autotune report``."""

from __future__ import annotations

from pathlib import Path

import click

from ..recommend.query import open_results, study_view
from .group import cli
from .options import storage_option, study_filter_options


@cli.command()
@study_filter_options
@storage_option
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="HTML file to write (default: next to the recommendation, results/<profile>/<model>.html).")
@click.option("--images/--no-images", default=True, show_default=True,
              help="Also write PNG images of the main plots (needs Chrome or Chromium).")
@click.option("--open", "open_it", is_flag=True, help="Open the report in the default browser.")
def report(profile: str | None, model: str | None, workload: str | None, storage: str | None, output: str | None,
           images: bool, open_it: bool) -> None:
    """Write a self-contained HTML report of a study, with PNG images.

    The report is one HTML file that works offline. It shows the Pareto front of prefill against decode, the optimization
    history, parameter importances, throughput by weight type and by thread count, the
    recommended config against the engine defaults, and the machine profile.
    """
    from ..recommend.report import write_report  # heavy: plotly, loaded by this command alone

    view = study_view(open_results(storage), profile, model, workload)
    result = write_report(view, Path(output) if output else None, images=images)
    click.echo(f"Report written to {result.html}")
    for path in result.images:
        click.echo(f"Image written to {path}")
    if result.images_missing:
        click.echo(f"No images: {result.images_missing}", err=True)
    if open_it:
        click.launch(str(result.html))
