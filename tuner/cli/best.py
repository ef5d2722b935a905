"""``autotune best``."""

from __future__ import annotations

import click

from ..selection import decision
from ..recommend.query import open_results, study_view
from .group import cli
from .options import parse_cpus, storage_option, study_filter_options
from .render import candidates_table, console, echo_json, recommendation_table, short_settings
from ..service import appconfig  # appconfig.autoconfig read at call time: tests stand in for it


@cli.command()
@study_filter_options
@storage_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--predict", is_flag=True, help="Show the settings this machine gets before any trial of its own: "
              "measured here, else predicted from the most similar stored profile, else the engine's defaults.")
@click.option("--cpus", metavar="LIST", help="With --predict: as if restricted to these CPUs (e.g. 0), "
              "like autotune run --cpus.")
def best(profile: str | None, model: str | None, workload: str | None, storage: str | None, fmt: str,
         predict: bool, cpus: str | None) -> None:
    """Show a study's recommended settings, Pareto front and picks.

    The recommendation is shown against the engine's defaults, ranked by the study's objective
    (by default the time one request takes). Also the Pareto front of prefill and decode tokens/s
    and the named picks: fastest_request, balanced, fastest_decode, fastest_prefill and
    leanest_memory. Each is a config that was really measured; its trials are listed.
    With --predict: what `tuner.autoconfig()` gives this machine, and which profile it comes from.
    """
    if predict:
        _predict(model, workload, storage, cpus, fmt)
        return
    view = study_view(open_results(storage), profile, model, workload)
    doc = view.recommendation()
    # The Pareto front and the picks are views of every study (a single-figure objective only ranks).
    front = decision.judged_front(view.candidates)
    picks = decision.picks(view.candidates)
    if fmt == "json":
        echo_json({"study": view.name, "objective": view.objective, "recommendation": doc,
                   "pareto_front": [c.public() for c in front],
                   "picks": {name: c.public() for name, c in picks.items()}})
        return
    out = console()
    out.print(recommendation_table(doc))
    if front:
        out.print(candidates_table("Pareto front (no config is faster at both prefill and decode)",
                                   [(str(i + 1), c) for i, c in enumerate(front)]))
        out.print(candidates_table("Picks", list(picks.items())))
    out.print(f"[dim]study {view.name}; export it with `autotune export {view.filters}`[/dim]")


def _predict(model: str | None, workload: str | None, storage: str | None, cpus: str | None, fmt: str) -> None:
    config = appconfig.autoconfig(model, workload or "default", storage, cpus=parse_cpus(cpus))
    if fmt == "json":
        echo_json({"source": config.source, "profile": config.profile, "similarity": config.similarity,
                   "study": config.study, "settings": config.settings, "model_path": config.model_path,
                   "figures": config.figures})
        return
    click.echo(f"settings: {short_settings(config.settings)}")
    click.echo(f"from: {config.describe()}")
