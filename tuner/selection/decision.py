"""The one decision rule: whether one measured config is faster than another, and which config wins.

Every place that chooses a config (the recommendation, the named picks, the confirmation stage's list,
the incumbent of the local refinement and of the composite, the backend comparison, autoconfig and
``autotune check``) asks this module, so a run never decides one way in one place and another way in
the next.

The rule works on the per-repetition samples of the figure an objective ranks by (requests per second
for the request time, tokens/s otherwise), on a log scale, so ratios are what count:

* The difference between two configs is the **Hodges-Lehmann shift**: the median of every pairwise
  difference of their log samples. One outlier repetition moves it little and cannot widen anything.
* Its **confidence interval** comes from the same pairwise differences, cut at the ranks the
  Mann-Whitney distribution gives for a 90% interval (exact for small samples). Two configs are
  *significantly different* when that interval excludes zero.
* Two configs are **tied** only when they are not significantly different *and* the whole interval of
  their shift lies inside the practical equivalence margin (``TIE_MARGIN``, 3%): a tie is a measured
  equivalence, not a failure to tell them apart. With too few samples for a finite interval (2 against 2,
  1 against n, 2 against 3: no rank can be cut) nothing is tied, however close the medians. A config that
  cannot be told apart from another and is not shown equivalent is **undecided**: it is ranked by its
  median and is worth more repetitions (the confirmation stage's deciding rounds), never a tie.
* The winner is the best config by median; only the configs truly tied with it compete, and among those
  the one that changes the fewest settings from its backend's defaults wins.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

from ..config import objectives
from ..measure.figures import Measured
from ..measure.records import Role
from .candidates import Candidate
from .targets import Targets, quality_key

M = TypeVar("M", bound=Measured)  # what ranked() orders: records, candidates, figures so far

TIE_MARGIN = 0.03   # configs whose whole shift interval lies within this (and not significant) are a tie
CONFIDENCE = 0.90   # the interval of the shift; with 3 against 3 repetitions 90% is the most there is
BETTER, WORSE, TIED, UNDECIDED = "better", "worse", "tied", "undecided"


@dataclass(frozen=True)
class Comparison:
    """How config ``a`` compares with config ``b`` on one objective (``ratio`` > 1: ``a`` is faster)."""

    ratio: float      # exp(Hodges-Lehmann shift of the log samples): a's speed over b's
    low: float        # the confidence interval of that ratio
    high: float
    verdict: str      # BETTER, WORSE, TIED or UNDECIDED (a is ... than b)

    @property
    def significant(self) -> bool:
        """Whether the interval excludes equality."""
        return self.low > 1.0 or self.high < 1.0


def speed_samples(measured: Measured, objective: str) -> list[float]:
    """The per-repetition samples an objective ranks by, higher is better (requests per second for
    the request time); the median alone where no samples were stored."""
    return objectives.get(objective).sampled(measured)


def _logs(values: Iterable[float]) -> list[float]:
    return [math.log(v) for v in values if v is not None and v > 0 and math.isfinite(v)]


@lru_cache(maxsize=256)
def _u_lower_tail(n: int, m: int) -> tuple[float, ...]:
    """P(U <= u) for u = 0..n*m, the exact Mann-Whitney distribution of two samples of n and m."""
    # counts[k][u]: ways for the first k of the n+m ranks ... built by the classic recursion over (n, m).
    table: dict[tuple[int, int], list[int]] = {}

    def ways(a: int, b: int) -> list[int]:
        if (a, b) in table:
            return table[(a, b)]
        if a == 0 or b == 0:
            out = [1]
        else:
            left, right = ways(a - 1, b), ways(a, b - 1)
            out = [0] * (a * b + 1)
            for u, w in enumerate(left):     # the largest value comes from the first sample: adds b
                out[u + b] += w
            for u, w in enumerate(right):
                out[u] += w
        table[(a, b)] = out
        return out

    counts = ways(n, m)
    total = sum(counts)
    cumulative, acc = [], 0
    for c in counts:
        acc += c
        cumulative.append(acc / total)
    return tuple(cumulative)


def _rank_cut(n: int, m: int) -> int:
    """How many pairwise differences to cut from each end for the ``CONFIDENCE`` interval (0: none can be)."""
    alpha = (1 - CONFIDENCE) / 2
    if n * m > 400:  # the normal approximation, for pooled samples
        z = statistics.NormalDist().inv_cdf(1 - alpha)
        return max(int(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12)), 0)
    tail = _u_lower_tail(n, m)
    cut = 0
    while cut < len(tail) and tail[cut] <= alpha + 1e-12:
        cut += 1
    return cut


def compare(a: Measured, b: Measured, objective: str) -> Comparison:
    """How ``a`` compares with ``b`` (anything with the figures of a trial or a pooled candidate): BETTER or
    WORSE when the interval of the shift excludes equality, TIED when all of it lies within ``TIE_MARGIN``,
    else UNDECIDED (always so with too few samples for a finite interval)."""
    xa, xb = _logs(speed_samples(a, objective)), _logs(speed_samples(b, objective))
    if not xa or not xb:
        return Comparison(1.0, 0.0, math.inf, UNDECIDED)
    diffs = sorted(x - y for x in xa for y in xb)
    shift = statistics.median(diffs)
    cut = _rank_cut(len(xa), len(xb))
    low, high = (diffs[cut - 1], diffs[-cut]) if cut > 0 else (-math.inf, math.inf)
    significant = low > 0 or high < 0
    margin = math.log1p(TIE_MARGIN)
    if significant:
        verdict = BETTER if shift > 0 else WORSE
    elif -margin <= low and high <= margin:  # the whole interval inside the margin (never an infinite one)
        verdict = TIED
    else:
        verdict = UNDECIDED
    return Comparison(math.exp(shift), math.exp(low), math.exp(high), verdict)


def estimate(measured: Measured, objective: str) -> float:
    """The figure configs are ordered by, higher is better: the objective's score of the medians."""
    return objectives.get(objective).score(measured)


def ranked(cands: Iterable[M], objective: str) -> list[M]:
    """``cands`` best first by their medians (the order undecided configs keep)."""
    return sorted(cands, key=lambda c: -estimate(c, objective))


def share(cand: Measured, top: Measured, objective: str) -> float:
    """``cand``'s speed as a share of ``top``'s (1.0 for as fast; a request twice as long is 0.5)."""
    return score_share(estimate(cand, objective), estimate(top, objective))


def score_share(score: float, top_score: float) -> float:
    """A config scoring ``score`` as a share of one scoring ``top_score`` on one objective (1.0 for as fast)."""
    if top_score > 0:
        return score / top_score
    return top_score / score if score < 0 else 0.0  # request time: scores are minus seconds


def judged(cands: list[Candidate]) -> list[Candidate]:
    """The configs a recommendation is chosen from: those of the latest confirmation stage, measured side
    by side, unless that stage confirmed nothing but a baseline (then every config)."""
    confirmed = [c for c in cands if c.confirmed]
    if len(confirmed) >= 2 or (confirmed and Role.BASELINE not in confirmed[0].roles):
        return confirmed
    return cands


def baseline(cands: Iterable[Candidate], backend: str) -> Candidate | None:
    """The measured defaults of ``backend`` among ``cands``, if any."""
    return next((c for c in cands if Role.BASELINE in c.roles and c.backend == backend), None)


def changed_settings(cand: Candidate, base: Candidate | None) -> int:
    """How many settings ``cand`` changes from ``base`` (its backend's defaults); 0 without a baseline."""
    if base is None:
        return 0
    return sum(1 for k, v in cand.settings.items() if base.settings.get(k) != v)


def pareto_front(cands: list[Candidate]) -> list[Candidate]:
    """Configs no other config beats on both prefill and decode medians, fastest decode first."""
    front = [c for c in cands if not any(
        o.prefill.median >= c.prefill.median and o.decode.median >= c.decode.median
        and (o.prefill.median > c.prefill.median or o.decode.median > c.decode.median) for o in cands)]
    return sorted(front, key=lambda c: -c.decode.median)


def judged_front(cands: list[Candidate]) -> list[Candidate]:
    """The Pareto front a recommendation is chosen from: that of :func:`judged` (the configs measured side by
    side in the latest confirmation stage, when there is one), so the front shown holds the pick."""
    return pareto_front(judged(cands))


def within_ceiling(cands: list[Candidate], ceiling: int | None) -> list[Candidate]:
    """The configs whose measured peak memory is at most ``ceiling`` bytes (all of them without one)."""
    return cands if not ceiling else [c for c in cands if c.peak_rss <= ceiling]


def best(cands: list[Candidate], objective: str, *, among: Callable[[Candidate], bool] | None = None,
         ceiling: int | None = None, targets: Targets | None = None) -> Candidate | None:
    """The winning config for ``objective``, or None when nothing qualifies.

    Only the configs of the latest confirmation stage compete when there is one (:func:`judged`), only
    those ``among`` accepts, only those whose peak memory fits ``ceiling``; for an objective with several
    values only the Pareto front. The best by median wins unless other configs are truly tied with it
    (:func:`compare`); then the one the objective's tie-break prefers (goodput: the lower p90 time to first
    token), then the one that changes the fewest settings from its backend's defaults.

    With ``targets`` (:mod:`tuner.selection.targets`) the question is the best quality that is fast enough: only
    configs meeting every target compete (those of the confirmation stage first, else any), and of those
    only the weights of the lowest KL divergence from the source; the rule above decides among them.
    """
    pool = within_ceiling(judged(cands), ceiling)
    pool = [c for c in pool if among is None or among(c)]
    if targets is not None and targets.active:
        pool = [c for c in pool if targets.feasible(c)] or [
            c for c in within_ceiling(cands, ceiling) if targets.feasible(c) and (among is None or among(c))]
        lowest = min((quality_key(c) for c in pool), default=None)
        pool = [c for c in pool if quality_key(c) == lowest]
    if not pool:
        return None
    if objectives.get(objective).multi:
        pool = pareto_front(pool)
    top = ranked(pool, objective)[0]
    tied = [c for c in pool if c is top or compare(c, top, objective).verdict == TIED]
    tie_break = objectives.get(objective).tie_break or (lambda c: 0.0)  # goodput: the lower p90 latency
    return min(tied, key=lambda c: (tie_break(c), changed_settings(c, baseline(cands, c.backend)),
                                    -estimate(c, objective)))


def undecided(cands: list[Candidate], objective: str, targets: Targets | None = None) -> list[Candidate]:
    """The configs that cannot yet be told apart from the winner: not significantly different and not shown
    equivalent (an interval reaching past the tie margin, or none for too few samples), so worth more
    repetitions before the choice is trusted. With ``targets``
    the winner is :func:`best`'s under them and only configs meeting them are its rivals."""
    top = best(cands, objective, targets=targets)
    if top is None:
        return []
    return [c for c in judged(cands) if c is not top and compare(c, top, objective).verdict == UNDECIDED
            and (targets is None or not targets.active or targets.feasible(c))]


PICKS = ("fastest_request", "balanced", "fastest_decode", "fastest_prefill", "leanest_memory")
LEAN_WITHIN = 0.9  # leanest_memory: the smallest peak among configs within 90% of the best balance


def picks(cands: list[Candidate]) -> dict[str, Candidate | None]:
    """The named picks, each a real measured config, each chosen by :func:`best` on its own figure
    (leanest memory: the smallest peak among the configs within 90% of the best balance)."""
    if not cands:
        return {}
    best_balance = max(objectives.balanced(c) for c in cands)
    lean_pool = [c for c in cands if objectives.balanced(c) >= LEAN_WITHIN * best_balance]
    return {
        "fastest_request": best(cands, "request_time") or cands[0],
        "balanced": best(cands, "balanced"),
        "fastest_decode": best(cands, "decode"),
        "fastest_prefill": best(cands, "prefill"),
        "leanest_memory": min(lean_pool, key=lambda c: (c.peak_rss, -objectives.balanced(c))),
    }


def best_of_each(cands: list[Candidate], objective: str, key: Callable[[Candidate], str]) -> dict[str, Candidate]:
    """The winner of each group of ``cands`` (grouped by ``key``, e.g. the backend), best group first."""
    groups: dict[str, list[Candidate]] = {}
    for cand in cands:
        groups.setdefault(key(cand), []).append(cand)
    winners = {k: best(group, objective) for k, group in groups.items()}
    order = ranked([w for w in winners.values() if w is not None], objective)
    return {key(w): w for w in order}
