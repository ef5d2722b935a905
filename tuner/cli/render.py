"""Rich tables shared by commands."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table

from ..units import format_bytes


def _stat(stat: dict[str, Any] | None, unit: str = "") -> str:
    if not stat:
        return "-"
    return f"{stat['median']:.1f}{unit} ±{stat['cv'] * 100:.0f}% (n={stat['n']})"


def recommendation_table(doc: dict[str, Any]) -> Group:
    """The end-of-run summary of a recommendation document."""
    settings = doc["settings"]
    figures = doc["figures"]
    base = doc.get("baseline")
    table = Table(title=f"Recommended for {doc['profile']['name']} · {doc['model'].get('name', '')} · "
                        f"workload {doc['workload']['name']} · objective {doc['objective']}",
                  title_justify="left")
    table.add_column("", style="bold")
    table.add_column("recommended")
    table.add_column("baseline (defaults)")
    table.add_column("speedup")
    for key in settings:
        table.add_row(key, str(settings[key]), str(base["settings"].get(key, "-")) if base else "-", "")
    speed = doc.get("speedup", {})
    table.add_row("prefill tok/s", _stat(figures["prefill_tps"]), _stat(base["figures"]["prefill_tps"]) if base else "-",
                  f"{speed['prefill']:.2f}x" if speed else "-")
    table.add_row("decode tok/s", _stat(figures["decode_tps"]), _stat(base["figures"]["decode_tps"]) if base else "-",
                  f"{speed['decode']:.2f}x" if speed else "-")
    ttft = figures.get("ttft_s")
    table.add_row("time to first token", f"{ttft['median'] * 1000:.0f} ms" if ttft else "-",
                  f"{base['figures']['ttft_s']['median'] * 1000:.0f} ms" if base and base["figures"].get("ttft_s") else "-", "")
    table.add_row("peak memory", format_bytes(figures["peak_rss_bytes"]),
                  format_bytes(base["figures"]["peak_rss_bytes"]) if base else "-", "")
    parts: list[Any] = [table]
    if "backends" in doc:
        parts.append(doc["backends"]["text"])
    if "roofline" in doc:
        roof = doc["roofline"]
        parts.append(f"Decode reaches {roof['decode_efficiency']:.0%} of the memory-bandwidth limit "
                     f"({roof['memory_bandwidth_gbs']} GB/s, {format_bytes(roof['decode_bytes_per_token'])} read per token).")
    return Group(*parts)
