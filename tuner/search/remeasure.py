"""The confirmation stage that ends a run: which configs are measured again, how often, and the budget
kept for it.

A search trial's figures are a few repetitions taken at one moment, and the best-looking of many
such trials is the luckiest as often as the fastest (the winner's curse grows with the number of
configs a run tries). Before a config is recommended, the winner, the closest config of other weights
(the rival that could still be the machine's best), its baseline (so the speedup compares figures
taken side by side), the best config of each other weight type that came close, and the other top
configs are measured again in interleaved rounds (A B C, then C B A), each round
one trial of the asked repetitions per config. The trials carry the stage's id
(:data:`tuner.selection.candidates.CONFIRM_ATTR`) and the recommendation is chosen among the stage's configs on the
stage's figures alone (:func:`tuner.selection.decision.judged`). Three rounds, so one trial disturbed by
another process cannot move a config's median; configs come first, then precision: a fourth
round runs only when every wanted config fits. One config alone compares nothing, so where three rounds
fit only one, two rounds of the first two (A B, B A) are run instead (:func:`fit`); where not even those
fit, there is no stage (unless one config is all that was asked, ``--remeasure 1``): no reserve is kept and
its time is the search's (issue 41). The search keeps a
reserve of its budget for the stage, sized by each config's own trial time, at most ``MAX_RESERVE_SHARE``
of the budget, or up to ``PAIR_RESERVE_SHARE`` where that is what it takes to confirm two configs: on a
busy machine, where every trial is slower, the smaller share buys only one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..measure.rounds import interleaved, round_order
from .repetitions import planned as planned_repetitions
from ..selection import decision, candidates as select
from ..selection.targets import Targets


class TuneOptions(Protocol):
    """What re-measuring reads of a run's options (:class:`tuner.search.tune.TuneOptions` is one)."""

    remeasure: int
    objective: str
    budget_s: float
    targets: Targets | None
    repetitions: int


REMEASURE_TOP = 4             # the winner and up to three runners-up
MIN_ROUNDS, MAX_ROUNDS = 3, 4  # interleaved rounds: each config gets this many more trials (with 3, one
                               # trial disturbed by another process cannot move a config's median)
PAIR_ROUNDS = 2               # or this many of two configs, where three rounds fit only one (two compare; one cannot)
MAX_RESERVE_SHARE = 0.3       # at most this share of the budget is kept for re-measuring,
PAIR_RESERVE_SHARE = 0.45     # or up to this share when only that fits the winner and one rival
FAMILY_WITHIN = 0.9           # another weight type's best is a runner-up first when within 10% of the winner
ROUND_SAFETY = 1.25           # a round starts only if 1.25x its configs' typical trial times fit before the budget ends
MAX_EXTRA_ROUNDS = 3          # deciding rounds (the winner and its undecided rivals only) added after the planned ones


def trial_cost(cand: select.Candidate, repetitions: int = 0, budget_s: float | None = None) -> float:
    """Seconds one re-measure of ``cand`` with ``repetitions`` timed repetitions is planned at: its
    expected wall time (:meth:`tuner.selection.candidates.Candidate.trial_s`: a search trial that stopped
    at two repetitions costs less than a re-measure of three) with the ``ROUND_SAFETY`` margin a round must
    fit with (the run's own work between trials, a slower repetition). The plan, the reserve and the
    stage's start rule all count with it, so the rounds the reserve was kept for are the rounds that start.
    With the run's ``budget_s``, the repetitions are those a trial keeps where one costs ``cand``'s
    (:func:`tuner.search.repetitions.planned`: a costly request, a share of the budget, is repeated less)."""
    return ROUND_SAFETY * cand.trial_s(planned_repetitions(repetitions, cand.rep_s, budget_s))


def winner_and_baseline(cands: list[select.Candidate], objective: str, targets: Targets | None = None) -> list[select.Candidate]:
    """The best config so far (the best quality meeting ``targets`` when given) and its backend's baseline
    (once, if the winner is not the baseline)."""
    chosen = decision.best(cands, objective, targets=targets)
    if chosen is None:
        return []
    base = decision.baseline(cands, chosen.backend)
    return [chosen] if base is None or base.config_key == chosen.config_key else [chosen, base]


def family(cand: select.Candidate) -> tuple[str, str]:
    """What makes two configs different programs rather than two tunings of one: backend and weights."""
    return cand.backend, str(cand.settings.get("quant", cand.settings.get("dtype", "")))


def close_rival(cand: select.Candidate, top: select.Candidate, objective: str) -> bool:
    """Whether ``cand`` is other weights (another :func:`family`) within ``FAMILY_WITHIN`` of ``top``
    on ``objective``: a different program that could still be this machine's best."""
    return family(cand) != family(top) and decision.share(cand, top, objective) >= FAMILY_WITHIN


def runners_up(cands: list[select.Candidate], objective: str, n: int, targets: Targets | None = None) -> list[select.Candidate]:
    """Up to ``n`` distinct configs worth confirming, the recommended one first: then the best config
    of each other family within ``FAMILY_WITHIN`` of it (many lucky variants of one weight type must
    not crowd out the other weights), then the rest by ``objective``."""
    top = decision.best(cands, objective, targets=targets)
    if top is None:
        return []
    ranked = decision.ranked([c for c in cands if targets is None or not targets.active or targets.feasible(c)],
                             objective)
    seen = {family(top)}
    close = []
    for cand in ranked:
        if family(cand) not in seen and close_rival(cand, top, objective):
            seen.add(family(cand))
            close.append(cand)
    return _distinct([top, *close, *ranked])[:n]


def _distinct(cands: list[select.Candidate]) -> list[select.Candidate]:
    """``cands`` in order, each config once (its first place)."""
    first: dict[str, select.Candidate] = {}
    for cand in cands:
        first.setdefault(cand.config_key, cand)
    return list(first.values())


def to_remeasure(cands: list[select.Candidate], options: "TuneOptions") -> list[select.Candidate]:
    """The configs to confirm, most needed first: the winner; the best config of other weights within
    ``FAMILY_WITHIN`` of it, the one rival that could still be this machine's best (where the stage
    fits only two configs, the pick is decided between them); its baseline (so the speedup compares
    figures taken side by side); then the other runners-up (:func:`runners_up`)."""
    if options.remeasure <= 0:
        return []
    again = winner_and_baseline(cands, options.objective, options.targets)
    ups = runners_up(cands, options.objective, options.remeasure, options.targets)
    rival = [c for c in ups[1:2] if again and close_rival(c, again[0], options.objective)]
    return _distinct([*again[:1], *rival, *again[1:], *ups])


def plan(cands: list[select.Candidate], options: "TuneOptions", seconds: float,
         count: int = MIN_ROUNDS) -> list[select.Candidate]:
    """The configs of :func:`to_remeasure` whose ``count`` re-measures fit in ``seconds``, in that
    order, each costing its own :func:`trial_cost` per round (a config that would not fit is passed over; a
    cheaper one after it may still fit)."""
    chosen, left = [], seconds
    for cand in to_remeasure(cands, options):
        cost = count * trial_cost(cand, options.repetitions, options.budget_s)
        if cost <= left:
            chosen.append(cand)
            left -= cost
    return chosen


def fit(cands: list[select.Candidate], options: "TuneOptions", seconds: float) -> tuple[list[select.Candidate], int]:
    """(configs, least rounds) of the stage that fits in ``seconds``: the configs :func:`plan` fits
    ``MIN_ROUNDS`` rounds of, where they are two or more; else, where three rounds fit only one config (a busy
    machine's slow trials), ``PAIR_ROUNDS`` rounds of the first two that fit so many, since one config
    compares nothing and the pick would stay the search's luckiest; else none: three rounds of one config
    compare nothing, and their time is better spent searching (issue 41). One config only where the run
    asked for one (``remeasure`` 1)."""
    chosen = plan(cands, options, seconds)
    if len(chosen) >= 2:
        return chosen, MIN_ROUNDS
    pair = plan(cands, options, seconds, PAIR_ROUNDS)[:2]
    if len(pair) == 2:
        return pair, PAIR_ROUNDS
    return (chosen, MIN_ROUNDS) if options.remeasure == 1 else ([], MIN_ROUNDS)


def round_count(planned: list[select.Candidate], wanted: int, seconds: float, repetitions: int = 0,
                least: int = MIN_ROUNDS, budget_s: float | None = None) -> int:
    """How many interleaved rounds to run: ``least`` (:func:`fit`), up to ``MAX_ROUNDS`` when every one of
    the ``wanted`` configs is planned and the rounds fit in ``seconds`` (configs first, then precision)."""
    per_round = sum(trial_cost(c, repetitions, budget_s) for c in planned)
    if len(planned) < wanted or per_round <= 0:
        return least
    return max(least, min(MAX_ROUNDS, int(seconds // per_round)))


def rounds(planned: list[select.Candidate], count: int = MIN_ROUNDS) -> list[select.Candidate]:
    """The order the planned re-measures run in: ``count`` interleaved rounds
    (:func:`tuner.measure.rounds.interleaved`: A B C, C B A, ...)."""
    return [cand for _, cand in interleaved(planned, count)]


def staged(cands: list[select.Candidate], options: "TuneOptions", seconds: float) -> tuple[list[select.Candidate], int]:
    """(configs, rounds) of the confirmation stage that fits in ``seconds``: the configs :func:`fit` finds
    and the :func:`round_count` of them."""
    planned, least = fit(cands, options, seconds)
    return planned, round_count(planned, len(to_remeasure(cands, options)), seconds, options.repetitions, least,
                                options.budget_s)


def schedule(cands: list[select.Candidate], options: "TuneOptions", seconds: float) -> list[select.Candidate]:
    """Every re-measure trial of the confirmation stage that fits in ``seconds``, in the order to run them."""
    return rounds(*staged(cands, options, seconds))


def reserve_seconds(cands: list[select.Candidate], options: "TuneOptions") -> float:
    """Seconds kept back for the stage :func:`schedule` fits in ``MAX_RESERVE_SHARE`` of the budget, as
    the study stands now (a re-measure that would not fit keeps nothing back: that time is search time).
    Where the share buys every wanted config ``MAX_ROUNDS`` rounds (configs first, then precision), it also
    keeps one deciding round of the first two (:func:`run_stage`) if that fits too. Where it does not buy
    ``MIN_ROUNDS`` rounds of two configs, up to ``PAIR_RESERVE_SHARE`` is kept for the first two that fit
    in it (:func:`fit`: three rounds, or two), if two do."""
    cap = MAX_RESERVE_SHARE * options.budget_s
    configs, count = staged(cands, options, cap)
    stage = count * sum(trial_cost(c, options.repetitions, options.budget_s) for c in configs)
    if len(configs) < 2 or count < MIN_ROUNDS:
        pair, least = fit(cands, options, PAIR_RESERVE_SHARE * options.budget_s)
        pair_s = sum(trial_cost(c, options.repetitions, options.budget_s) for c in pair[:2])
        return least * pair_s if len(pair) >= 2 else stage
    if count < MAX_ROUNDS:
        return stage
    deciding = sum(trial_cost(c, options.repetitions, options.budget_s) for c in configs[:2])
    return stage + deciding if stage + deciding <= cap else stage


def deciding_round(planned: list[select.Candidate], measured: list[select.Candidate],
                   objective: str, targets: Targets | None = None) -> list[select.Candidate]:
    """The configs of a deciding round: the winner on the stage's figures (under ``targets`` when given)
    and each rival it cannot yet be told apart from (:func:`tuner.selection.decision.undecided`), as
    planned; none when it is decided. Only these are measured again: the configs already known to be
    slower, or missing a target, would spend the time for nothing."""
    rivals = decision.undecided(measured, objective, targets)
    top = decision.best(measured, objective, targets=targets)
    if not rivals or top is None:
        return []
    wanted = {top.config_key, *(c.config_key for c in rivals)}
    chosen = [c for c in planned if c.config_key in wanted]
    return chosen if len(chosen) >= 2 and top.config_key in {c.config_key for c in chosen} else []


def run_stage(cands: list[select.Candidate], options: "TuneOptions", left: Callable[[], float],
              run_round: Callable[[list[select.Candidate], int], None],
              measured: Callable[[], list[select.Candidate]]) -> tuple[int, int, int]:
    """Run the confirmation stage: (configs, rounds run, rounds planned).

    The configs and rounds are those :func:`staged` fits in the time ``left()``; each round starts only if all of
    it fits (``ROUND_SAFETY`` times its configs' trial times), so no round is cut at the deadline and
    every config gets the same number of rounds. After the planned rounds, while the winner cannot be
    told apart from a rival on the figures ``measured()`` returns, up to ``MAX_EXTRA_ROUNDS`` deciding
    rounds (:func:`deciding_round`: the winner and those rivals alone, so they cost two trials rather
    than a whole round) run where they fit; the two still get the same number of rounds.
    """
    planned, wanted = staged(cands, options, left())
    if not planned:
        return 0, 0, 0
    cost = sum(trial_cost(c, options.repetitions, options.budget_s) for c in planned)
    done = 0
    while done < wanted and left() >= cost:
        run_round(round_order(planned, done), done)
        done += 1
    while done >= wanted and done - wanted < MAX_EXTRA_ROUNDS:
        deciding = deciding_round(planned, measured(), options.objective, options.targets)
        if not deciding or left() < sum(trial_cost(c, options.repetitions, options.budget_s) for c in deciding):
            break
        run_round(round_order(deciding, done), done)
        done += 1
    return len(planned), done, wanted
