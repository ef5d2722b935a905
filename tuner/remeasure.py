"""Re-measurement at the end of a run: which configs are measured again, and the budget kept for it.

A search trial's figures are a few repetitions taken at one moment; before a config is
recommended, the winner, its baseline (so the speedup compares equally measured figures) and the
other top configs are measured again in ``REMEASURE_FACTOR`` interleaved rounds of the trial's
repetitions each, and the recommendation is chosen from the pooled figures. The search keeps a reserve of its budget for
that, sized by each config's own trial time: in a 10-minute run a noisy winner is compared with its
runners-up measured as thoroughly, where before only the winner was sure of its re-measure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import select

if TYPE_CHECKING:
    from .search import TuneOptions

REMEASURE_TOP = 3
REMEASURE_FACTOR = 2          # re-measurement rounds: each config gets this many more trials
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


def plan(cands: list[select.Candidate], options: "TuneOptions", seconds: float) -> list[select.Candidate]:
    """The configs of :func:`to_remeasure` whose re-measures fit in ``seconds``, in that order, each
    costing ``REMEASURE_FACTOR`` times its own trial time (a re-measure that would not fit is passed
    over; a cheaper one after it may still fit)."""
    chosen, left = [], seconds
    for cand in to_remeasure(cands, options):
        cost = REMEASURE_FACTOR * cand.wall_s
        if cost <= left:
            chosen.append(cand)
            left -= cost
    return chosen


def rounds(planned: list[select.Candidate]) -> list[select.Candidate]:
    """The order the planned re-measures run in: ``REMEASURE_FACTOR`` interleaved rounds, each round
    one trial per config, every other round reversed (A B C, C B A), so a drift in the machine's speed
    during the re-measures falls on every config alike instead of deciding between close ones."""
    return [c for i in range(REMEASURE_FACTOR) for c in (planned if i % 2 == 0 else planned[::-1])]


def reserve_seconds(cands: list[select.Candidate], options: "TuneOptions") -> float:
    """Seconds kept back for the re-measures :func:`plan` fits in ``MAX_RESERVE_SHARE`` of the budget,
    as the study stands now (a re-measure that would not fit keeps nothing back: that time is search time)."""
    return sum(REMEASURE_FACTOR * c.wall_s for c in plan(cands, options, MAX_RESERVE_SHARE * options.budget_s))
