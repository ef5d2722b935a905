"""Rich tables shared by commands."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table

from .. import backends
from ..util.units import format_bytes


def short_settings(settings: dict[str, Any]) -> str:
    """Settings as compact text, e.g. ``quant=Q4_0 t=1 tb=2 b=512``."""
    backend = backends.get(settings.get("backend"))
    keys, prefix = backend.summary_keys, backend.summary_prefix
    abbrev = {"n_threads": "t", "n_threads_batch": "tb", "n_batch": "b", "n_ubatch": "ub", "n_ctx": "c",
              "flash_attn": "fa", "type_k": "k", "type_v": "v", "torch_threads": "t", "use_cache": "cache",
              "repack": "rp"}
    return prefix + " ".join(f"{abbrev.get(k, k)}={settings[k]}" for k in keys if k in settings)


def _stat(stat: dict[str, Any] | None, unit: str = "") -> str:
    if not stat:
        return "-"
    return f"{stat['median']:.1f}{unit} ±{stat['cv'] * 100:.0f}% (n={stat['n']})"


def _seconds(stat: dict[str, Any] | None) -> str:
    if not stat:
        return "-"
    return f"{stat['median']:.2f} s ±{stat['cv'] * 100:.0f}% (n={stat['n']})"


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def quant_table(rows: list[dict[str, Any]]) -> Table:
    """Per weight type: best prefill and decode, perplexity, quality loss, mean and p99 KL divergence from
    the source, top-token agreement, file size."""
    table = Table(title="Weight types tried (KL: nats per token against the source)", title_justify="left")
    for col in ("quant", "best prefill", "best decode", "perplexity", "loss", "KL", "KL p99", "top-1 agree",
                "file size", "usable"):
        table.add_column(col, justify="left" if col == "quant" else "right")
    for r in rows:
        name = r["quant"] if r["quant"] != "source" else f"source ({r['file_type']})"
        table.add_row(name, _num(r["best_prefill_tps"]), _num(r["best_decode_tps"]), _num(r["perplexity"], "{:.2f}"),
                      _num(r["quality_loss"], "{:+.1%}"), _num(r.get("kl_mean"), "{:.4f}"),
                      _num(r.get("kl_p99"), "{:.3f}"), _num(r.get("top_agreement"), "{:.1%}"),
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
    if figures.get("goodput_tps"):  # the serve workload: what several users get
        _serving_rows(table, figures, base["figures"] if base else None, speed)
        return Group(table, *_serving_lines(doc))
    table.add_row("prefill tok/s", _stat(figures["prefill_tps"]), _stat(base["figures"]["prefill_tps"]) if base else "-",
                  f"{speed['prefill']:.2f}x" if speed else "-")
    table.add_row("decode tok/s (after prompt)", _stat(figures["decode_tps"]), _stat(base["figures"]["decode_tps"]) if base else "-",
                  f"{speed['decode']:.2f}x" if speed else "-")
    depth_row = _depth_row(figures, base)
    if depth_row:
        table.add_row(*depth_row)
    request = figures.get("request_s")
    base_request = base["figures"].get("request_s") if base else None
    table.add_row("request time", _seconds(request), _seconds(base_request),
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


def _serving_rows(table: Table, figures: dict[str, Any], base: dict[str, Any] | None, speed: dict[str, Any]) -> None:
    """The serve workload's rows: goodput, throughput and latency over all users, capacity, memory."""
    mine, theirs = figures.get("serving") or {}, (base or {}).get("serving") or {}

    def row(label: str, key: str, fmt: Any, ratio: str = "") -> None:
        def shown(data: dict[str, Any]) -> str:
            return fmt(data[key]) if data.get(key) is not None else "-"
        table.add_row(label, shown(mine), shown(theirs) if base else "-", ratio)

    table.add_row(f"goodput tok/s ({mine.get('users', '?')} users)", _stat(figures["goodput_tps"]),
                  _stat(base.get("goodput_tps")) if base and base.get("goodput_tps") else "-",
                  f"{speed['goodput']:.2f}x" if speed.get("goodput") else "from none"
                  if base and (base.get("goodput_tps") or {}).get("median") == 0 else "-")
    row("output tok/s, all users", "output_tps", lambda v: f"{v:.1f}")
    row("requests within targets", "met_targets", lambda v: f"{v:.0f}")
    row("requests completed", "completed", lambda v: f"{v:.0f}")
    row("p90 time to first token", "ttft_p90_s", lambda v: f"{v * 1000:.0f} ms")
    row("p90 time per output token", "tpot_p90_s", lambda v: f"{v * 1000:.0f} ms")
    capacity, base_capacity = figures.get("capacity"), (base or {}).get("capacity")
    table.add_row("capacity (users within targets)", str(capacity["users"]) if capacity else "not swept",
                  str(base_capacity["users"]) if base_capacity else "-" if not base else "not swept", "")
    table.add_row("peak memory", format_bytes(figures["peak_rss_bytes"]),
                  format_bytes(base["peak_rss_bytes"]) if base else "-", "")


def _serving_lines(doc: dict[str, Any]) -> list[str]:
    """The targets and the server command under the serve workload's table."""
    workload = doc["workload"]
    lines = [f"Targets: first token within {workload.get('max_ttft_s', 0):g} s, then at most "
             f"{workload.get('max_tpot_s', 0) * 1000:g} ms per token (--max-ttft, --max-tpot)."]
    if doc.get("serving_command"):
        lines.append("Serve it as measured: autotune serve --workload " + str(workload["name"]).split("@")[0]
                     + "   or   " + " ".join(str(part) for part in doc["serving_command"]))
    return lines


def _depth_row(figures: dict[str, Any], base: dict[str, Any] | None) -> list[str] | None:
    """The decode-at-depth row of the recommendation table (issue 29), or None before it was measured."""
    depth = figures.get("decode_depth_tps")
    if not depth:
        return None
    base_depth = (base or {}).get("figures", {}).get("decode_depth_tps")
    ratio = f"{depth['median'] / base_depth['median']:.2f}x" if base_depth and base_depth["median"] else "-"
    label = f"decode at depth {figures['depth']}" if figures.get("depth") else "decode at depth"
    return [label + " tok/s", _stat(depth), _stat(base_depth) if base_depth else "-", ratio]


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
        table.add_row(label, short_settings(cand.settings), _stat(cand.prefill.public()), _stat(cand.decode.public()),
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
