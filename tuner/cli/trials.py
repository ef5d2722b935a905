"""``autotune trials``."""

from __future__ import annotations

import csv
import io
from typing import Any

import click

from ..recommend.query import open_results, study_view, trial_rows
from ..measure.records import Stat
from ..backends.settings import TrialSettings
from ..util.units import format_bytes
from .group import cli
from .options import storage_option, study_filter_options
from .render import console, echo_json, rows_table, short_settings

# --sort COLUMN -> (key, descending); trials without the figure sort last.
SORTS = {
    "number": (lambda r: r["number"], False),
    "role": (lambda r: r["role"], False),
    "state": (lambda r: r["state"], False),
    "prefill": (lambda r: (r["prefill_tps"] or {}).get("median", -1.0), True),
    "decode": (lambda r: (r["decode_tps"] or {}).get("median", -1.0), True),
    "decode-depth": (lambda r: (r.get("decode_depth_tps") or {}).get("median", -1.0), True),
    "memory": (lambda r: r["peak_rss_bytes"] or float("inf"), False),
}


def _figure(stat: dict[str, Any] | None) -> str:
    return str(Stat.from_dict(stat)) if stat else "-"


def _state(row: dict[str, Any]) -> str:
    return f"{row['state']}\n({row['cause']})" if row["cause"] else row["state"]


def to_csv(rows: list[dict[str, Any]]) -> str:
    """Trial rows as CSV: one column per figure and per setting that any trial has."""
    names = [n for n in TrialSettings.model_fields if any(n in r["settings"] for r in rows)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["number", "role", "state", "cause", "detail", "prefill_tps", "prefill_cv", "decode_tps", "decode_cv",
                     "decode_depth_tps", "decode_depth_cv", "depth", "peak_rss_bytes", "wall_s", *names])
    for r in rows:
        figures = [v for key in ("prefill_tps", "decode_tps", "decode_depth_tps") for v in
                   ((r[key]["median"], r[key]["cv"]) if r.get(key) else ("", ""))] + [r.get("depth") or ""]
        writer.writerow([r["number"], r["role"], r["state"], r["cause"], r["detail"], *figures, r["peak_rss_bytes"] or "",
                         r["wall_s"] if r["wall_s"] is not None else "", *(r["settings"].get(n, "") for n in names)])
    return out.getvalue()


@cli.command()
@study_filter_options
@storage_option
@click.option("--sort", type=click.Choice(list(SORTS)), default="number", show_default=True,
              help="Order rows by this column (figures: best first).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
def trials(profile: str | None, model: str | None, workload: str | None, storage: str | None, sort: str,
           fmt: str) -> None:
    """Show every trial of a study: settings, outcome and figures.

    The state is complete, failed (with the signal, exit code or cause) or infeasible (with
    the constraint it breaks). Figures are the median tokens/s with their spread across
    repetitions; memory is the trial process's peak resident memory.
    """
    view = study_view(open_results(storage), profile, model, workload)
    key, descending = SORTS[sort]
    rows = sorted(trial_rows(view.study), key=key, reverse=descending)
    if fmt == "json":
        echo_json({"study": view.name, "trials": rows})
    elif fmt == "csv":
        click.echo(to_csv(rows), nl=False)
    else:
        varying = {k for r in rows for k, v in r["settings"].items() if any(o["settings"].get(k) != v for o in rows)}
        same = {k: v for k, v in (rows[0]["settings"] if rows else {}).items() if k not in varying}
        out = console()
        out.print(rows_table(f"Trials of {view.name}", ["#", "role", "state", "settings", "prefill tok/s",
                                                        "decode tok/s", "at depth", "memory"],
                             [[str(r["number"]), r["role"], _state(r),
                               short_settings({k: v for k, v in r["settings"].items() if k in varying}),
                               _figure(r["prefill_tps"]), _figure(r["decode_tps"]),
                               _figure(r.get("decode_depth_tps")) + (f"\n@{r['depth']}" if r.get("depth") else ""),
                               format_bytes(r["peak_rss_bytes"]) if r["peak_rss_bytes"] else "-"] for r in rows]))
        if same:
            out.print(f"Same in every trial: {short_settings(same)}")
        for r in rows:
            if r["detail"]:
                out.print(f"#{r['number']} {r['state']}: {r['detail']}")
