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


def request_seconds(measured: Any) -> float | None:
    """Median seconds one request of the workload took (prefill to the first token, then the decode
    of the rest; a chat's whole conversation with the session cache kept), or None if not measured."""
    stat = getattr(measured, "request", None)
    return stat.median if stat is not None and stat.median > 0 else None


def _cv(stat: Any) -> float:
    return stat.cv if stat is not None else 0.0


NEVER_S = 1e6  # told to Optuna for a config that produced no request time (it breaks a constraint)


@dataclass(frozen=True)
class Objective:
    """One way to judge a config."""

    name: str
    description: str
    directions: tuple[str, ...]
    told: Callable[[Any], list[float]]   # the values told to Optuna
    ranked: Callable[[Any], float]       # higher is better
    spread: Callable[[Any], float]       # relative noise of the ranked figure (its CV)
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

    def tied(self, a: Any, b: Any) -> bool:
        """Whether ``a`` and ``b`` differ by less than their measured spread: a tie within noise."""
        sa, sb = self.score(a), self.score(b)
        if not (math.isfinite(sa) and math.isfinite(sb)):
            return False
        return abs(sa - sb) <= max(self.spread(a), self.spread(b)) * max(abs(sa), abs(sb))


def _balanced_cv(m: Any) -> float:
    return (_cv(m.prefill) + _cv(m.decode)) / 2  # a geometric mean's relative error, to first order


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("request_time", "minimize the seconds one request of the workload takes: time to first token "
              "plus the decode of the answer (the wait a user feels)", ("minimize",),
              lambda m: [request_seconds(m) or NEVER_S], lambda m: -(request_seconds(m) or math.inf),
              lambda m: _cv(getattr(m, "request", None)), unit="s"),
    Objective("pareto", "maximize prefill and decode tokens/s together (ranked by their geometric mean)",
              ("maximize", "maximize"), lambda m: [_median(m.prefill), _median(m.decode)], balanced, _balanced_cv),
    Objective("balanced", "maximize the geometric mean of prefill and decode tokens/s",
              ("maximize",), lambda m: [balanced(m)], balanced, _balanced_cv),
    Objective("decode", "maximize decode tokens/s", ("maximize",), lambda m: [_median(m.decode)],
              lambda m: _median(m.decode), lambda m: _cv(m.decode)),
    Objective("prefill", "maximize prefill tokens/s", ("maximize",), lambda m: [_median(m.prefill)],
              lambda m: _median(m.prefill), lambda m: _cv(m.prefill)),
)}
DEFAULT = "request_time"


def get(name: str | None) -> Objective:
    """The objective called ``name`` (the default for None); AutotuneError for an unknown name."""
    try:
        return OBJECTIVES[name or DEFAULT]
    except KeyError:
        raise AutotuneError(f"unknown objective {name!r}: choose one of {', '.join(OBJECTIVES)}") from None


def names() -> tuple[str, ...]:
    """Every objective name."""
    return tuple(OBJECTIVES)
