"""When a trial stops before its last repetition: the adaptive repetition rule the child follows, and the
checks the parent runs after each repetition (``on_repetition`` of :func:`tuner.measure.runner.run_child`):
the study's pruner and the outclassed rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from ..config import objectives
from ..measure import disturbance
from ..measure.figures import PartialFigures
from ..selection import decision
from .state import TrialContext


ADAPTIVE_CV = 0.03  # an adaptive trial stops once its request times agree within this CV


def adaptive_rule(repetitions: int) -> dict[str, float]:
    """Adaptive repetitions for a search trial asked for ``repetitions``: at least 2 (or that many, if
    fewer), stop once their CV is below 3%, go on while it is above, up to the number asked.

    Not beyond it: in ``benchmarks/regret.py`` a cap of twice the ask made the search slower to come
    within 3% of the optimum (the extra repetitions went mostly to configs that could not win); the
    precision a winner needs comes from the re-measurement of the top configs at the end of a run."""
    return {"min": min(2, repetitions), "max": repetitions, "cv": ADAPTIVE_CV}


def _pruning(ctx: TrialContext, trial: optuna.Trial) -> Callable[[dict[str, Any]], str | None] | None:
    """Report each repetition's figures to Optuna as intermediate values (step = repetitions done)
    and ask the study's pruner whether the trial can still win; None for a multi-objective study
    (Optuna prunes single-objective studies only)."""
    judge = objectives.get(ctx.objective)
    if judge.multi:
        return None

    def check(figures: dict[str, Any]) -> str | None:
        so_far = PartialFigures.of(figures)
        step = so_far.repetitions
        value = judge.values(so_far)[0]
        with ctx.storage.errors():
            trial.report(value, step)
            if trial.should_prune():
                return (f"pruned after {step} repetition(s): {judge.name} {value:.4g} was worse than the median "
                        "of the other trials at that step (Optuna's median rule): it is not measured further")
        return None

    return check


OUTCLASSED_SHARE = 0.5  # a trial whose first repetition runs under half the best config's speed stops there
DISTURBED_SLOWDOWN = 4.0  # a disturbed repetition may run up to this much slower (a 2-thread decode with a busy CPU)


def _outclassed(ctx: TrialContext, best_score: float,
                disturbed_share: float | None = None) -> Callable[[dict[str, Any]], str | None]:
    """Stop a trial after a repetition that scores under ``OUTCLASSED_SHARE`` of ``best_score`` (the best config
    so far, on the run's objective): more repetitions would make a config that cannot be recommended more
    precise, at the price of search trials (a transformers baseline of three repetitions took 87 s of a
    5-minute run on a 2-vCPU EPYC, where llama.cpp requests ran 4x faster).

    A repetition another process disturbed (:mod:`tuner.measure.disturbance`) may be slow for that: it
    stops the trial only under ``disturbed_share`` of the best (default ``OUTCLASSED_SHARE /
    DISTURBED_SLOWDOWN``: even undisturbed it could not reach half). Where the best config's own figures
    were measured disturbed too, or the machine was busy from the start (:mod:`tuner.measure.load`), the
    two compare like with like and the caller passes ``OUTCLASSED_SHARE``: on a busy machine every
    repetition is disturbed, and a rule that waits for a quiet one never fires (a transformers baseline
    took 190 of 600 s under a busy neighbour)."""
    judge = objectives.get(ctx.objective)
    bar_disturbed = OUTCLASSED_SHARE / DISTURBED_SLOWDOWN if disturbed_share is None else disturbed_share

    def check(figures: dict[str, Any]) -> str | None:
        watched = figures.get(disturbance.KEY) or []
        disturbed = bool(watched and watched[-1].get("disturbed"))
        so_far = PartialFigures.of(figures)
        share = decision.score_share(judge.score(so_far), best_score)
        if so_far.repetitions and 0 < share < (bar_disturbed if disturbed else OUTCLASSED_SHARE):
            how = " (disturbed by other processes, as the best config's figures were)" if disturbed else ""
            return (f"stopped after {so_far.repetitions} repetition(s): {share:.0%} of the speed of the best "
                    f"config so far on {judge.name}{how}, so it cannot be recommended; not measured further")
        return None

    return check


def _first_reason(*checks: Callable[[dict[str, Any]], str | None] | None) -> Callable[[dict[str, Any]], str | None] | None:
    """One ``on_repetition`` check of several: the first reason any of them gives to stop (None: go on)."""
    active = [c for c in checks if c is not None]
    if not active:
        return None
    return lambda figures: next((reason for c in active if (reason := c(figures))), None)


def on_repetition(ctx: TrialContext, trial: optuna.Trial, adaptive: bool, outclassed_by: float | None,
                  outclassed_disturbed: float | None) -> Callable[[dict[str, Any]], str | None] | None:
    """The check run after each repetition of ``trial``: the pruner's (an ``adaptive`` trial) and the outclassed
    rule's (with ``outclassed_by``, the best config's score so far); None where neither applies."""
    return _first_reason(_pruning(ctx, trial) if adaptive else None,
                         _outclassed(ctx, outclassed_by, outclassed_disturbed) if outclassed_by else None)
