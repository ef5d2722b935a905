"""The serve workload's recommendation table: the pick against llama-server's defaults and against the
single-request pick served the same way (issue 43), with the latency targets and the server's command."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table

from ..util.units import format_bytes
from .cells import stat

NO_SINGLE = ("No single-request pick of this model on this machine to compare with: `autotune run` (the default "
             "workload) tunes one, and a serve run after it measures it served by llama-server the same way.")


def serving_table(doc: dict[str, Any], title: str) -> Group:
    """The recommendation, llama-server's defaults and the single-request pick (when the run measured it):
    settings, goodput, throughput and latency over all users, capacity, memory; the targets and the command."""
    columns = {"recommended": doc, "llama-server defaults": doc.get("baseline"),
               "single-request pick": doc.get("single_request_pick")}
    shown = {name: part for name, part in columns.items() if part}
    table = Table(title=title, title_justify="left")
    table.add_column("", style="bold")
    for name in shown:
        table.add_column(name)
    for key in doc["settings"]:
        table.add_row(key, *(str(part["settings"].get(key, "-")) for part in shown.values()))
    figures = [part["figures"] for part in shown.values()]
    users = (doc["figures"].get("serving") or {}).get("users", "?")
    table.add_row(f"goodput tok/s ({users} users)", *(stat(f.get("goodput_tps")) for f in figures))
    for label, key, fmt in ROWS:
        table.add_row(label, *(_serving_cell(f, key, fmt) for f in figures))
    table.add_row("capacity (users within targets)",
                  *(str(f["capacity"]["users"]) if f.get("capacity") else "not swept" for f in figures))
    table.add_row("peak memory", *(format_bytes(f["peak_rss_bytes"]) for f in figures))
    return Group(table, *comparison_lines(doc))


ROWS = (("output tok/s, all users", "output_tps", "{:.1f}"), ("requests within targets", "met_targets", "{:.0f}"),
        ("requests completed", "completed", "{:.0f}"), ("p90 time to first token", "ttft_p90_s", "ms"),
        ("p90 time per output token", "tpot_p90_s", "ms"))


def _serving_cell(figures: dict[str, Any], key: str, fmt: str) -> str:
    value = (figures.get("serving") or {}).get(key)
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if fmt == "ms" else fmt.format(value)


def comparison_lines(doc: dict[str, Any]) -> list[str]:
    """The pick's goodput and capacity against the defaults and the single-request pick, the targets, and the
    command that serves the pick as measured."""
    workload, mine = doc["workload"], doc["figures"]
    lines = [f"{name}: goodput {_ratio(mine, part['figures'])}, {_capacities(mine, part['figures'])}"
             for name, part in
             (("Against llama-server's defaults", doc.get("baseline")),
              ("Against the single-request pick served the same way", doc.get("single_request_pick"))) if part]
    if not doc.get("single_request_pick"):
        lines.append(NO_SINGLE)
    lines.append(f"Targets: first token within {workload.get('max_ttft_s', 0):g} s, then at most "
                 f"{workload.get('max_tpot_s', 0) * 1000:g} ms per token (--max-ttft, --max-tpot).")
    if doc.get("serving_command"):
        lines.append("Serve it as measured: autotune serve --workload " + str(workload["name"]).split("@")[0]
                     + "   or   " + " ".join(str(part) for part in doc["serving_command"]))
    return lines


def _ratio(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    """The goodput ratio of two configs' figures: ``2.10x``, ``from none`` (theirs met no target)."""
    ours, base = (mine.get("goodput_tps") or {}).get("median"), (theirs.get("goodput_tps") or {}).get("median")
    if ours is None or base is None:
        return "not measured"
    return f"{ours / base:.2f}x" if base else f"{ours:.1f} tok/s from none"


def _capacities(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    """Two configs' capacities (``capacity 8 against 4 users``), saying which was not swept."""
    ours, other = ((f.get("capacity") or {}).get("users") for f in (mine, theirs))
    if ours is None or other is None:
        return f"capacity {_or_not_swept(ours)} against {_or_not_swept(other)}"
    return f"capacity {ours} against {other} users"


def _or_not_swept(users: int | None) -> str:
    return "not swept" if users is None else f"{users} users"
