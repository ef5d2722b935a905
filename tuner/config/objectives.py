"""Objectives: what a run tells Optuna and how measured configs are ranked, in one place.

An objective turns what a config measured into the values Optuna optimizes (``values``, with
its ``directions``), into one number that orders configs, higher is better (``score``), and into
the per-repetition samples of that figure (``sampled``) on which :mod:`tuner.selection.decision` decides whether
one config is faster than another. Both take anything with ``prefill`` and ``decode`` :class:`tuner.measure.records.Stat` figures
(a trial's record or a pooled candidate).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import AutotuneError


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


def _samples(stat: Any) -> list[float]:
    """A figure's per-repetition samples (its median alone for a record stored without them)."""
    if stat is None or stat.median <= 0:
        return []
    return [float(s) for s in stat.samples] or [float(stat.median)]


def _per_second(measured: Any) -> list[float]:
    """Requests per second, one per repetition (higher is better)."""
    return [1.0 / s for s in _samples(getattr(measured, "request", None)) if s > 0]


def _balanced_samples(measured: Any) -> list[float]:
    """The geometric mean of prefill and decode, repetition by repetition (both are stored in step)."""
    prefill, decode = _samples(measured.prefill), _samples(measured.decode)
    if len(prefill) != len(decode):
        prefill, decode = [statistics.median(prefill)] if prefill else [], [statistics.median(decode)] if decode else []
    return [math.sqrt(p * d) for p, d in zip(prefill, decode)]


def _p90_ttft(measured: Any) -> float:
    """The serve workload's p90 time to first token (its windows' median; a config without one last)."""
    stat = getattr(measured, "ttft", None)
    return stat.median if stat is not None and stat.median > 0 else math.inf


NEVER_S = 1e6  # told to Optuna for a config that produced no request time (it breaks a constraint)


@dataclass(frozen=True)
class Objective:
    """One way to judge a config."""

    name: str
    description: str
    directions: tuple[str, ...]
    told: Callable[[Any], list[float]]   # the values told to Optuna
    ranked: Callable[[Any], float]       # higher is better
    sampled: Callable[[Any], list[float]]  # the ranked figure per repetition, higher is better
    unit: str = "tokens/s"
    tie_break: Callable[[Any], float] | None = None  # among truly tied configs, the lowest of this wins


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
    Objective("request_time", "minimize the seconds one request of the workload takes: time to first token "
              "plus the decode of the answer (the wait a user feels)", ("minimize",),
              lambda m: [request_seconds(m) or NEVER_S], lambda m: -(request_seconds(m) or math.inf),
              _per_second, unit="s"),
    Objective("pareto", "maximize prefill and decode tokens/s together (ranked by their geometric mean)",
              ("maximize", "maximize"), lambda m: [_median(m.prefill), _median(m.decode)], balanced,
              _balanced_samples),
    Objective("balanced", "maximize the geometric mean of prefill and decode tokens/s",
              ("maximize",), lambda m: [balanced(m)], balanced, _balanced_samples),
    Objective("decode", "maximize decode tokens/s", ("maximize",), lambda m: [_median(m.decode)],
              lambda m: _median(m.decode), lambda m: _samples(m.decode)),
    Objective("prefill", "maximize prefill tokens/s", ("maximize",), lambda m: [_median(m.prefill)],
              lambda m: _median(m.prefill), lambda m: _samples(m.prefill)),
    Objective("goodput", "maximize goodput, the output tokens/s of the requests that meet the latency targets "
              "with several users (the serve workload's default)", ("maximize",),
              lambda m: [_median(getattr(m, "goodput", None))], lambda m: _median(getattr(m, "goodput", None)),
              lambda m: _samples(getattr(m, "goodput", None)), tie_break=_p90_ttft),
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
