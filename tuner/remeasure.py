"""Re-measurement at the end of a run: which configs are measured again, and the budget kept for it.

A search trial's figures are a few repetitions taken at one moment; before a config is
recommended, the top configs (and the winner's baseline, so the speedup compares equally measured
figures) are measured again with ``REMEASURE_FACTOR`` times the repetitions. The search keeps a
reserve of its budget for that, sized by each config's own trial time.
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
    """The top configs, then the winner's baseline (so the speedup compares equally measured
    figures), less those an earlier run already measured thoroughly."""
    if options.remeasure <= 0:
        return []
    again = select.top(cands, options.objective, options.remeasure)
    keys = {c.config_key for c in again}
    again += [c for c in winner_and_baseline(cands, options.objective) if c.config_key not in keys]
    thorough = options.repetitions * (REMEASURE_FACTOR + 1)
    return [c for c in again if len(c.prefill.samples) < thorough]


def reserve_seconds(cands: list[select.Candidate], options: "TuneOptions") -> float:
    """Seconds kept back for re-measuring: the winner and its baseline as they stand now, each at
    ``REMEASURE_FACTOR`` times its own trial time, as many of them as fit in ``MAX_RESERVE_SHARE`` of
    the budget (a re-measure that would not fit keeps nothing back: that time goes to the search)."""
    keys = {c.config_key for c in winner_and_baseline(cands, options.objective)}
    cap, kept = MAX_RESERVE_SHARE * options.budget_s, 0.0
    for cand in to_remeasure(cands, options):
        cost = REMEASURE_FACTOR * cand.wall_s
        if cand.config_key in keys and kept + cost <= cap:
            kept += cost  # only what fits is kept back: a reserve too small for its re-measure is search time
    return kept
