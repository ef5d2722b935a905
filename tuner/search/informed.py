"""Informed starts: one config per backend that is known to do well on CPUs, measured first.

A short run has room for the baselines and only a few search trials, and TPE's first trials are
random. So a study gets, right after the baselines, one enqueued trial per backend built
from what usually wins on a CPU (weights read once per token want a compact type; prefill wants
every CPU; decode wants one thread per physical core; flash attention saves KV traffic;
bfloat16 halves transformers' weight reads). Nothing is assumed to be faster: the config is
measured like any other trial, it only wins if it measures best, and TPE learns from it since
it is an ordinary sampled trial with fixed values (``Study.enqueue_trial``).

Only values the resolved space allows are fixed; the rest of the config is sampled as usual.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from .. import backends
from ..backends.base import LARGEST, SMALLEST
from .space import ResolvedSpace

INFORMED_ATTR = "autotune_informed_start"


def _smallest(dist: BaseDistribution) -> Any:
    return min(dist.choices) if isinstance(dist, CategoricalDistribution) else None


def allowed(dist: BaseDistribution, value: Any) -> bool:
    """Whether ``value`` is one that ``dist`` can sample."""
    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    if isinstance(dist, IntDistribution):
        return isinstance(value, int) and dist.low <= value <= dist.high and (value - dist.low) % dist.step == 0
    return False


def decode_threads(cpus: int, physical_cores: int, logical_cores: int) -> int:
    """One decode thread per physical core among the ``cpus`` this process may use."""
    per_core = max(logical_cores // max(physical_cores, 1), 1)
    return max(cpus // per_core, 1)


def informed_configs(space: ResolvedSpace, physical_cores: int, logical_cores: int,
                     free_cpus: int | None = None) -> list[dict[str, Any]]:
    """The informed start of each backend in ``space``, as Optuna params the space allows. With ``free_cpus``
    (a busy machine, :meth:`tuner.measure.load.MachineLoad.free_cpus`) it runs on the CPUs other processes
    leave free: two threads contending with a busy CPU ran a 2-vCPU machine's prefill 7x slower."""
    cpus = space.cpus if free_cpus is None else max(1, min(space.cpus, free_cpus))
    threads = decode_threads(cpus, physical_cores, logical_cores)
    configs = []
    for backend in space.backends:
        params: dict[str, Any] = {"backend": backend} if "backend" in space.distributions else {}
        for name, value in backends.get(backend).informed_start(cpus, threads).items():
            dist = space.distributions.get(name)
            if dist is not None and value == SMALLEST:
                value = _smallest(dist)
            elif dist is not None and value == LARGEST:
                value = max(dist.choices) if isinstance(dist, CategoricalDistribution) else getattr(dist, "high", None)
            if dist is not None and value is not None and allowed(dist, value):
                params[name] = value
        if len(params) > ("backend" in params):
            configs.append(params)
    return configs


def allowed_params(space: ResolvedSpace, settings: dict[str, Any]) -> dict[str, Any]:
    """The Optuna params of ``settings`` that ``space`` samples and allows (the backend first)."""
    params = {}
    for name, value in settings.items():
        dist = space.distributions.get(name)
        if dist is not None and allowed(dist, value):
            params[name] = value
    if "backend" in space.distributions and "backend" not in params:
        return {}
    return params


def enqueue_next(study: optuna.Study, space: ResolvedSpace, physical_cores: int, logical_cores: int,
                 only: Collection[str] | None = None, free_cpus: int | None = None) -> bool:
    """Queue the first informed start that ``study`` has not had yet (of a backend among ``only`` when given);
    whether one was queued. On a busy machine its threads are those of the ``free_cpus`` left
    (:func:`informed_configs`).

    Called right before ``study.ask()``, so the queued trial is the next one asked and a run
    never leaves a queued trial behind; a resumed study gets the starts it is missing.
    Optuna's ``enqueue_trial(skip_if_exists=True)`` decides what the study has had: a trial
    whose fixed (or, if it had none, sampled) params equal the start's.
    """
    before = _waiting(study)
    for params in informed_configs(space, physical_cores, logical_cores, free_cpus):
        if only is not None and params.get("backend", space.backends[0]) not in only:
            continue
        # Optuna skips params that a trial of the study already has (queued, running or finished).
        study.enqueue_trial(params, user_attrs={INFORMED_ATTR: True}, skip_if_exists=True)
        if _waiting(study) - before:  # a trial queued that was not before
            return True
    return False


def _waiting(study: optuna.Study) -> set[int]:
    """Numbers of the queued (WAITING) trials: a new one means a start was queued.

    A set rather than a count, so another worker asking a queued trial meanwhile is no miss.
    """
    return {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
