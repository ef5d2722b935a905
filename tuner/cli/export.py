"""``autotune export``."""

from __future__ import annotations

from pathlib import Path

import click

from ..recommend import document as recommend
from ..errors import AutotuneError
from ..recommend.export import FORMATS, caveats, render, write
from ..recommend.query import open_results, study_view
from ..selection.decision import PICKS
from .group import cli
from .options import storage_option, study_filter_options


@cli.command()
@study_filter_options
@storage_option
@click.option("--pick", type=click.Choice(PICKS), help="Export a named pick instead of the study's best config.")
@click.option("--from", "source", type=click.Path(dir_okay=False),
              help="Convert this recommendation file instead of reading the database.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="yaml", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here instead of printing.")
def export(profile: str | None, model: str | None, workload: str | None, storage: str | None, pick: str | None,
           source: str | None, fmt: str, output: str | None) -> None:
    """Export a recommendation for other tools.

    yaml and json are the versioned recommendation file `autotune run` writes (an older
    file given with --from is upgraded; a newer one is refused). llama-server prints its
    command line; llama-cpp-server writes a config for `python -m llama_cpp.server
    --config_file FILE`; ollama writes a Modelfile with the tuned PARAMETER lines.
    """
    if source:
        if pick or profile or model or workload:
            raise AutotuneError("--from converts a recommendation file as it is: drop --pick, --profile, "
                                "--model and --workload")
        doc = recommend.load(source)
    else:
        doc = study_view(open_results(storage), profile, model, workload).recommendation(pick)
    for line in caveats(doc, fmt):
        click.echo(f"Note: {line}", err=True)
    if output:
        path = write(doc, fmt, Path(output))
        click.echo(f"{fmt} written to {path}", err=True)
    else:
        click.echo(render(doc, fmt), nl=False)
