"""Re-measurement at the end of a run: which configs are measured again, and the budget kept for it.

A search trial's figures are a few repetitions taken at one moment; before a config is
recommended, the winner, its baseline (so the speedup compares equally measured figures) and the
other top configs are measured again with ``REMEASURE_FACTOR`` times the repetitions, and the
recommendation is chosen from the pooled figures. The search keeps a reserve of its budget for
that, sized by each config's own trial time: in a 10-minute run a noisy winner is compared with its
runners-up measured as thoroughly, where before only the winner was sure of its re-measure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import select

if TYPE_CHECKING:
    from .search import TuneOptions

REMEASURE_TOP = 3
REMEASURE_FACTOR = 2          # re-measurements take this many times the repetitions
MAX_RESERVE_SHARE = 0.3       # at most this share of the budget is kept for re-measuring


def winner_and_baseline(cands: list[select.Candidate], objective: str) -> list[select.Candidate]:
    """The best config so far and its backend's baseline (once, if the winner is not the baseline)."""
    chosen = select.best(cands, objective)
    if chosen is None:
        return []
    base = select.baseline(cands, chosen.backend)
    return [chosen] if base is None or base.config_key == chosen.config_key else [chosen, base]


def to_remeasure(cands: list[select.Candidate], options: "TuneOptions") -> list[select.Candidate]:
    """The configs to measure again, most needed first: the winner, its baseline (so the speedup
    compares equally measured figures), then the other top configs (so a winner that was measured at
    a fast moment meets its runners-up measured as thoroughly), less those an earlier run already
    measured thoroughly."""
    if options.remeasure <= 0:
        return []
    again = winner_and_baseline(cands, options.objective)
    keys = {c.config_key for c in again}
    again += [c for c in select.top(cands, options.objective, options.remeasure) if c.config_key not in keys]
    thorough = options.repetitions * (REMEASURE_FACTOR + 1)
    return [c for c in again if len(c.prefill.samples) < thorough]


def reserve_seconds(cands: list[select.Candidate], options: "TuneOptions") -> float:
    """Seconds kept back for re-measuring the configs of :func:`to_remeasure` as they stand now, each
    at ``REMEASURE_FACTOR`` times its own trial time, in that order as many as fit in
    ``MAX_RESERVE_SHARE`` of the budget (a re-measure that would not fit keeps nothing back: that time
    goes to the search)."""
    cap, kept = MAX_RESERVE_SHARE * options.budget_s, 0.0
    for cand in to_remeasure(cands, options):
        cost = REMEASURE_FACTOR * cand.wall_s
        if kept + cost <= cap:
            kept += cost  # only what fits is kept back: a reserve too small for its re-measure is search time
    return kept
