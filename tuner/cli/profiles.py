"""``autotune profiles`` and ``autotune profile``."""

from __future__ import annotations

import os

import click

from ..recommend.query import open_results, profile_rows
from ..results.storage import open_storage
from ..util.units import format_bytes
from .group import cli
from .options import parse_cpus, storage_option
from .render import console, echo_json, rows_table
from .. import backends
from ..config.model import resolve_model
from ..machine.profile import detect_profile
from ..util.paths import default_storage_url


@cli.command()
@storage_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def profiles(storage: str | None, fmt: str) -> None:
    """List the machine profiles stored in the database, one row each.

    Shows each profile's hardware (CPU, CPUs autotune may use, RAM, GPU), how many studies
    and trials it has, and when it was last tuned.
    """
    rows = profile_rows(open_results(storage))
    if fmt == "json":
        echo_json(rows)
        return
    console().print(rows_table("Machine profiles", ["name", "id", "CPU", "cpus", "RAM", "GPU", "studies/trials",
                                                    "last tuned"],
                               [[r["name"], r["id"], r["cpu_model"], str(r["cpus"]), f"{r['ram_gib']} GiB", r["gpu"],
                                 f"{r['studies']}/{r['trials']}", (r["last_tuned"] or "-")[:10]]
                                for r in rows]))


def engine_facts(facts: dict, storage: str | None, probe: bool) -> dict:
    """The engine verdicts stored for this machine kind, or probed now on the bundled model."""
    stored: dict = {}
    url = storage or default_storage_url()
    if storage or os.path.isfile(url.removeprefix("sqlite:///")):
        known = [p for p in open_storage(url).profiles() if p.id == facts["id"]]
        stored = known[0].extra if known else {}
    health = backends.open_health(stored, facts)
    if health is None:
        return {}
    if probe:
        model = resolve_model(None)
        backends.for_format(model.format).probe_health(health, model)
    return health.public()


@cli.command()
@click.option("--cpus", metavar="LIST", help="Detect as if restricted to these CPUs, as `run --cpus` does.")
@click.option("--name", metavar="NAME", help="Profile name (default: derived from the hardware).")
@storage_option
@click.option("--probe/--no-probe", default=True, show_default=True,
              help="Probe weight repacking on the bundled model when nothing is stored for this machine.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def profile(cpus: str | None, name: str | None, storage: str | None, probe: bool, fmt: str) -> None:
    """Show this machine's detected profile in full, with what its engine can run.

    These are the facts `autotune run` stores with every study: the id is a hash of the
    hardware facts, so identical machines share a profile. The engine facts say whether
    llama.cpp's weight repacking (extra buffer types) runs here, per weight type, and why not.
    """
    facts = detect_profile(name, parse_cpus(cpus)).public()
    engine = engine_facts(facts, storage, probe)
    kept = backends.open_health({}, facts)
    key = kept.extra_key if kept is not None else "engine"
    facts["extra"][key] = engine
    if fmt == "json":
        echo_json(facts)
        return
    shown = {**facts, "ram_bytes": format_bytes(facts["ram_bytes"]), "cpus": ",".join(map(str, facts["cpus"])),
             "cpu_flags": " ".join(facts["cpu_flags"]) or "-", "extra": "",
             "memory_bandwidth_gbs": facts["memory_bandwidth_gbs"] or "measured by `autotune run`",
             "memory_bandwidth_all_gbs": facts["memory_bandwidth_all_gbs"] or "measured by `autotune run`"}
    rows = [[key, str(value)] for key, value in shown.items() if key != "extra"]
    rows += [[k, str(value)] for k, value in facts["extra"].items() if k != key]
    rows += [["engine", line] for line in backends.health_lines(facts["extra"])] or \
        [["engine", "weight repacking not probed yet (autotune run probes it)"]]
    console().print(rows_table(f"Profile {facts['name']}", ["fact", "value"], rows))
