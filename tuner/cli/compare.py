"""``autotune compare``."""

from __future__ import annotations

import click

from ..recommend.compare import compare as compare_profiles, sections, to_markdown
from ..recommend.query import open_results
from .group import cli
from .options import storage_option
from .render import console, echo_json, rows_table


@cli.command()
@click.argument("profiles", nargs=-1, required=True, metavar="PROFILE PROFILE [PROFILE...]")
@click.option("--model", "model", metavar="NAME", help="Model file name, stem or sha256 prefix (default: any "
              "model tuned on two of the profiles).")
@click.option("--workload", metavar="NAME", help="Workload name (default: any).")
@storage_option
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table",
              show_default=True)
def compare(profiles: tuple[str, ...], model: str | None, workload: str | None, storage: str | None,
            fmt: str) -> None:
    """Compare machine profiles side by side.

    Shows the hardware facts of each, then for every model and workload tuned on at least
    two of them (or the ones --model/--workload select): the best config of each, its
    figures, the speedup over the engine defaults, and the ratio to the first profile
    named. Settings that differ between the machines are marked with *.
    """
    data = compare_profiles(open_results(storage), list(profiles), model, workload)
    if fmt == "json":
        echo_json(data)
    elif fmt == "markdown":
        click.echo(to_markdown(data), nl=False)
    else:
        out = console()
        for title, headers, rows, note in sections(data):
            out.print(rows_table(title, headers, rows))
            if note:
                out.print(note)
        for note in data["notes"]:
            out.print(note)
