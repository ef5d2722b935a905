"""Objectives: what a run tells Optuna and how measured configs are ranked, in one place.

An objective turns what a config measured into the values Optuna optimizes (``values``, with
its ``directions``) and into one number that ranks configs, higher is better (``score``): the
recommendation, the picks, the re-measure list, the backend comparison and the report all rank
with it. Both take anything with ``prefill`` and ``decode`` :class:`tuner.records.Stat` figures
(a trial's record or a pooled candidate).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import AutotuneError


def _median(stat: Any) -> float:
    return max(stat.median, 0.0) if stat is not None else 0.0


def balanced(measured: Any) -> float:
    """Geometric mean of prefill and decode tokens/s (0 when either is missing)."""
    return math.sqrt(_median(measured.prefill) * _median(measured.decode))


@dataclass(frozen=True)
class Objective:
    """One way to judge a config."""

    name: str
    description: str
    directions: tuple[str, ...]
    told: Callable[[Any], list[float]]   # the values told to Optuna
    ranked: Callable[[Any], float]       # higher is better
    unit: str = "tokens/s"

    @property
    def multi(self) -> bool:
        """Whether Optuna optimizes several values at once (the study has a Pareto front)."""
        return len(self.directions) > 1

    def values(self, measured: Any) -> list[float]:
        """What Optuna is told for a measured config (a config without figures gets zeros)."""
        return self.told(measured)

    def score(self, measured: Any) -> float:
        """The number configs are ranked by, higher is better."""
        return self.ranked(measured)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("pareto", "maximize prefill and decode tokens/s together (ranked by their geometric mean)",
              ("maximize", "maximize"), lambda m: [_median(m.prefill), _median(m.decode)], balanced),
    Objective("balanced", "maximize the geometric mean of prefill and decode tokens/s",
              ("maximize",), lambda m: [balanced(m)], balanced),
    Objective("decode", "maximize decode tokens/s", ("maximize",), lambda m: [_median(m.decode)],
              lambda m: _median(m.decode)),
    Objective("prefill", "maximize prefill tokens/s", ("maximize",), lambda m: [_median(m.prefill)],
              lambda m: _median(m.prefill)),
)}
DEFAULT = "pareto"


def get(name: str | None) -> Objective:
    """The objective called ``name`` (the default for None); AutotuneError for an unknown name."""
    try:
        return OBJECTIVES[name or DEFAULT]
    except KeyError:
        raise AutotuneError(f"unknown objective {name!r}: choose one of {', '.join(OBJECTIVES)}") from None


def names() -> tuple[str, ...]:
    """Every objective name."""
    return tuple(OBJECTIVES)
