"""Rich tables shared by commands."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table

from .. import backends
from ..util.units import format_bytes
from .cells import num, seconds, stat
from .render_serving import serving_table


def short_settings(settings: dict[str, Any]) -> str:
    """Settings as compact text, e.g. ``quant=Q4_0 t=1 tb=2 b=512``."""
    backend = backends.get(settings.get("backend"))
    keys, prefix = backend.summary_keys, backend.summary_prefix
    abbrev = {"n_threads": "t", "n_threads_batch": "tb", "n_batch": "b", "n_ubatch": "ub", "n_ctx": "c",
              "flash_attn": "fa", "type_k": "k", "type_v": "v", "torch_threads": "t", "use_cache": "cache",
              "repack": "rp"}
    return prefix + " ".join(f"{abbrev.get(k, k)}={settings[k]}" for k in keys if k in settings)


def quant_table(rows: list[dict[str, Any]]) -> Table:
    """Per weight type: best prefill and decode, perplexity, quality loss, mean and p99 KL divergence from
    the source, top-token agreement, file size."""
    table = Table(title="Weight types tried (KL: nats per token against the source)", title_justify="left")
    for col in ("quant", "best prefill", "best decode", "perplexity", "loss", "KL", "KL p99", "top-1 agree",
                "file size", "usable"):
        table.add_column(col, justify="left" if col == "quant" else "right")
    for r in rows:
        name = r["quant"] if r["quant"] != "source" else f"source ({r['file_type']})"
        table.add_row(name, num(r["best_prefill_tps"]), num(r["best_decode_tps"]), num(r["perplexity"], "{:.2f}"),
                      num(r["quality_loss"], "{:+.1%}"), num(r.get("kl_mean"), "{:.4f}"),
                      num(r.get("kl_p99"), "{:.3f}"), num(r.get("top_agreement"), "{:.1%}"),
                      format_bytes(r["size_bytes"]),
                      "yes" if r["feasible"] else "no (quality)")
    return table


def chat_table(turns: list[dict[str, Any]]) -> Table:
    """Per chat turn: time to first token with the session cache kept vs the conversation re-sent."""
    table = Table(title="Chat: session KV cache reuse by turn", title_justify="left")
    for col in ("turn", "context tokens", "TTFT cached", "TTFT re-sent", "speedup"):
        table.add_column(col, justify="right")
    for t in turns:
        table.add_row(str(t["turn"]), str(t["context_tokens"]), f"{t['ttft_cached_s'] * 1000:.0f} ms",
                      f"{t['ttft_naive_s'] * 1000:.0f} ms", f"{t['ttft_speedup']:.1f}x")
    return table


def title(doc: dict[str, Any]) -> str:
    """The title of a recommendation's table: the profile, model, workload and objective."""
    return (f"Recommended for {doc['profile']['name']} · {doc['model'].get('name', '')} · "
            f"workload {doc['workload']['name']} · objective {doc['objective']}")


def recommendation_table(doc: dict[str, Any]) -> Group:
    """The end-of-run summary of a recommendation document."""
    settings = doc["settings"]
    figures = doc["figures"]
    base = doc.get("baseline")
    if figures.get("goodput_tps"):  # the serve workload: what several users get
        return serving_table(doc, title(doc))
    table = Table(title=title(doc), title_justify="left")
    table.add_column("", style="bold")
    table.add_column("recommended")
    table.add_column("baseline (defaults)")
    table.add_column("speedup")
    for key in settings:
        table.add_row(key, str(settings[key]), str(base["settings"].get(key, "-")) if base else "-", "")
    speed = doc.get("speedup", {})
    table.add_row("prefill tok/s", stat(figures["prefill_tps"]), stat(base["figures"]["prefill_tps"]) if base else "-",
                  f"{speed['prefill']:.2f}x" if speed else "-")
    table.add_row("decode tok/s (after prompt)", stat(figures["decode_tps"]), stat(base["figures"]["decode_tps"]) if base else "-",
                  f"{speed['decode']:.2f}x" if speed else "-")
    depth_row = _depth_row(figures, base)
    if depth_row:
        table.add_row(*depth_row)
    request = figures.get("request_s")
    base_request = base["figures"].get("request_s") if base else None
    table.add_row("request time", seconds(request), seconds(base_request),
                  f"{speed['request']:.2f}x" if speed.get("request") else "-")
    ttft = figures.get("ttft_s")
    table.add_row("time to first token", f"{ttft['median'] * 1000:.0f} ms" if ttft else "-",
                  f"{base['figures']['ttft_s']['median'] * 1000:.0f} ms" if base and base["figures"].get("ttft_s") else "-", "")
    table.add_row("peak memory", format_bytes(figures["peak_rss_bytes"]),
                  format_bytes(base["figures"]["peak_rss_bytes"]) if base else "-", "")
    parts: list[Any] = [table]
    if doc.get("speedup_by_backend"):
        parts.append("Speedup against each engine's defaults: " + "; ".join(
            f"{name} " + ", ".join(f"{k} {v:.2f}x" for k, v in speed.items())
            for name, speed in doc["speedup_by_backend"].items()) + ".")
    if "quants" in doc:
        parts.append(quant_table(doc["quants"]))
    if (doc.get("quality") or {}).get("meaningful") is False:
        parts.append(doc["quality"]["text"])
    if "chat_cache_reuse" in doc:
        parts.append(chat_table(doc["chat_cache_reuse"]))
    if "backends" in doc:
        parts.append(doc["backends"]["text"])
    if "kv_cache" in doc:
        parts.append(doc["kv_cache"]["text"])
    if "roofline" in doc:
        parts.append(doc["roofline"]["text"])
    if (doc.get("disturbance") or {}).get("text"):
        parts.append(doc["disturbance"]["text"])
    load = doc.get("machine_load") or {}
    if load.get("text") and (load.get("busy") or load.get("mixed")):  # a quiet machine needs no line
        parts.append(load["text"])
    unusable = (doc.get("engine") or {}).get("repack_unusable")
    if unusable:
        parts.append(f"Weight repacking (llama.cpp extra buffer types) crashes llama.cpp on this machine for "
                     f"{', '.join(unusable)}: those configs run with repack off.")
    return Group(*parts)


def _depth_row(figures: dict[str, Any], base: dict[str, Any] | None) -> list[str] | None:
    """The decode-at-depth row of the recommendation table (issue 29), or None before it was measured."""
    depth = figures.get("decode_depth_tps")
    if not depth:
        return None
    base_depth = (base or {}).get("figures", {}).get("decode_depth_tps")
    ratio = f"{depth['median'] / base_depth['median']:.2f}x" if base_depth and base_depth["median"] else "-"
    label = f"decode at depth {figures['depth']}" if figures.get("depth") else "decode at depth"
    return [label + " tok/s", stat(depth), stat(base_depth) if base_depth else "-", ratio]


def console() -> Any:
    """A rich console: the terminal's width on a terminal, 100 columns when piped or captured."""
    from rich.console import Console

    term = Console()
    return term if term.is_terminal else Console(width=100)


def echo_json(data: Any) -> None:
    """Print ``data`` as stable JSON: sorted keys, two-space indent."""
    import json

    import click

    click.echo(json.dumps(data, indent=2, sort_keys=True))


def candidates_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    """Named measured configs (select.Candidate) with their figures and the trials behind them."""

    table = Table(title=title, title_justify="left")
    for name in ("", "settings", "prefill tok/s", "decode tok/s", "memory", "trials"):
        table.add_column(name, style="bold" if not name else None)
    for label, cand in rows:
        table.add_row(label, short_settings(cand.settings), stat(cand.prefill.public()), stat(cand.decode.public()),
                      format_bytes(cand.peak_rss), ",".join(map(str, cand.trials)))
    return table


def rows_table(title: str, headers: list[str], rows: list[list[str]]) -> Table:
    """A plain table of text rows (no outer border), the first column in bold and never wrapped."""
    from rich import box

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  collapse_padding=True)
    for i, name in enumerate(headers):
        table.add_column(name, style="bold" if i == 0 else None, no_wrap=i == 0)
    for row in rows:
        table.add_row(*row)
    return table
