"""Figures of a serving window: latency percentiles, throughput, goodput, and capacity over a user sweep.

Goodput is what a server with several users is worth: the output tokens per second of the requests that met
the targets (first token within ``max_ttft_s``, then at most ``max_tpot_s`` per token), over the window. A
config that streams many tokens to requests that all wait 5 s for their first one has a high throughput and
no goodput. Capacity is the most users of a sweep whose p90 time to first token and p90 time per token meet
the targets.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from .serving_client import RequestResult


def percentile(values: Sequence[float], share: float) -> float | None:
    """The ``share`` (0-1) percentile of ``values``, linearly interpolated; None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = share * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def meets(result: RequestResult, max_ttft_s: float, max_tpot_s: float) -> bool:
    """Whether a request met both targets (one with a single token meets the per-token one trivially)."""
    if not result.ok or result.ttft_s is None or result.ttft_s > max_ttft_s:
        return False
    tpot = result.tpot_s
    return tpot is None or tpot <= max_tpot_s


def window_figures(results: Iterable[RequestResult], span: float | tuple[float, float], users: int,
                   max_ttft_s: float, max_tpot_s: float) -> dict[str, Any]:
    """The figures of one window with ``users`` users (plain data). ``span``: the window's (start, end) in the
    results' clock, when the tokens that arrived in it are counted (requests under way in the window, each
    judged whole; latencies of those that started in it), or its length in seconds, when every token of
    ``results`` counts."""
    results = list(results)
    if isinstance(span, tuple):
        start, end = span
        tokens = lambda r: r.tokens_between(start, end)  # noqa: E731
        started = [r for r in results if start <= r.started_s < end]
    else:
        start, end = 0.0, float(span)
        tokens = lambda r: r.output_tokens  # noqa: E731
        started = results
    elapsed_s = max(end - start, 1e-9)
    done = [r for r in started if r.ok]
    good = [r for r in results if r.ok and meets(r, max_ttft_s, max_tpot_s)]
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    tpot = [t for r in done if (t := r.tpot_s) is not None]
    return {
        "users": users, "elapsed_s": elapsed_s, "requests": len(started), "completed": len(done),
        "failed": len(started) - len(done), "met_targets": sum(meets(r, max_ttft_s, max_tpot_s) for r in done),
        "errors": sorted({r.error for r in results if r.error})[:3],
        "goodput_tps": sum(tokens(r) for r in good) / elapsed_s,
        "output_tps": sum(tokens(r) for r in results if r.ok) / elapsed_s,
        "prompt_tps": sum(r.prompt_tokens for r in done) / elapsed_s,
        "requests_per_s": len(done) / elapsed_s,
        "ttft_p50_s": percentile(ttft, 0.5), "ttft_p90_s": percentile(ttft, 0.9),
        "tpot_p50_s": percentile(tpot, 0.5), "tpot_p90_s": percentile(tpot, 0.9),
        "request_p50_s": percentile([r.total_s for r in done], 0.5),
    }


def within_targets(figures: dict[str, Any], max_ttft_s: float, max_tpot_s: float) -> bool:
    """Whether a window's p90 time to first token and p90 time per token meet the targets (and no request
    failed)."""
    ttft, tpot = figures.get("ttft_p90_s"), figures.get("tpot_p90_s")
    return (not figures.get("failed") and ttft is not None and ttft <= max_ttft_s
            and (tpot is None or tpot <= max_tpot_s))


def capacity(sweep: Sequence[dict[str, Any]], max_ttft_s: float, max_tpot_s: float) -> int:
    """The most users of a sweep (windows at growing user counts) that met the targets, counting only up to
    the first count that missed them (0: not even the smallest)."""
    best = 0
    for figures in sorted(sweep, key=lambda f: f["users"]):
        if not within_targets(figures, max_ttft_s, max_tpot_s):
            break
        best = int(figures["users"])
    return best


def summary(windows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One figure set for several windows of the same config: the median of each number (the window count
    and the errors seen kept as they are)."""
    if not windows:
        return {}
    out: dict[str, Any] = {"windows": len(windows), "users": windows[0]["users"]}
    for key in windows[0]:
        if key in out or key == "errors":
            continue
        values = [w[key] for w in windows if isinstance(w.get(key), (int, float)) and not isinstance(w[key], bool)]
        out[key] = statistics.median(values) if values else None
    out["errors"] = sorted({e for w in windows for e in w.get("errors", ())})[:3]
    return out
