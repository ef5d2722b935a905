"""Local refinement: the incumbent's untried neighbours, one setting changed at a time.

TPE models the whole space and samples where it expects good configs, but in a short search it
can spend many trials far from the best config found so far without trying the obvious next
step: the same config with one setting changed (the other weight type, one more thread, flash
attention on). The settings of a llama.cpp config act largely on their own (decode on its
threads, prefill on its batch threads and batch sizes), so such one-step moves from the
incumbent converge fast. The search interleaves them with TPE: each neighbour is queued as an
ordinary trial with fixed params (``Study.enqueue_trial``), measured, pruned and learnt from like
any other, and the incumbent moves as soon as a neighbour beats it. Once every neighbour of the
incumbent has been measured (a local optimum), refinement has nothing to propose and TPE alone
goes on.

Screening comes first: the settings with large effects (each backend names them, binary switches
first: flash attention, repacking, the weight type, the thread counts, the KV cache types) are changed
before the others, in the order of the effects a similar machine's stored study measured when there is
one. So whatever the informed start or a warm start fixed is measured the other way within the first
search trials: nothing that won on another CPU is taken for granted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import math

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from .. import backends
from ..selection import decision, candidates as select
from ..backends.settings import TrialSettings, config_key, normalize
from .informed import allowed
from .space import ResolvedSpace
from ..results.storage import asked_params

REFINE_ATTR = "autotune_refinement"  # user attribute of a queued neighbour: the setting it changed
SCREEN_ATTR = "autotune_screening"   # ... and whether that setting is one screened first


def _values(dist: BaseDistribution, current: Any, backend: str, name: str, busy: bool = False) -> list[Any]:
    """The other values of one setting, nearest first: adjacent steps of an integer range, then the
    rest; every other choice of a categorical one in the order its backend knows (weight types nearest
    in size first, :meth:`tuner.backends.base.Backend.nearest_first`), else in file order. On a ``busy``
    machine a thread count's smaller values come first (nearest first), then the larger ones."""
    if isinstance(dist, IntDistribution):
        values = range(dist.low, dist.high + 1, dist.step)
        if busy and name in thread_settings(backend):
            return sorted((v for v in values if v != current), key=lambda v: (v > current, abs(v - current)))
        return sorted((v for v in values if v != current), key=lambda v: (abs(v - current), v))
    if isinstance(dist, CategoricalDistribution):
        return backends.get(backend).nearest_first(name, current, [c for c in dist.choices if c != current])
    return []


def params_of(space: ResolvedSpace, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The Optuna params ``space`` would sample for ``settings``, or None when a searched setting of
    its backend has a value the space does not offer (a baseline's default, say)."""
    backend = settings.get("backend", space.backends[0])
    params: dict[str, Any] = {}
    for name in _asked(space, backend):
        value = backend if name == "backend" else settings.get(name)
        if not allowed(space.distributions[name], value):
            return None
        params[name] = value
    return params


class _Recorder:
    """A stand-in trial that notes the names ``ResolvedSpace.suggest`` asks for."""

    def __init__(self, backend: str) -> None:
        self.backend, self.asked = backend, []

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        self.asked.append(name)
        return self.backend if name == "backend" else choices[0]

    def suggest_int(self, name: str, low: int, high: int, **_: Any) -> int:
        self.asked.append(name)
        return low


def _asked(space: ResolvedSpace, backend: str) -> list[str]:
    """The params ``space`` samples for a config of ``backend``, in the space's order."""
    recorder = _Recorder(backend)
    space.suggest(recorder)  # type: ignore[arg-type]
    return recorder.asked


def key_of(space: ResolvedSpace, params: dict[str, Any]) -> str:
    """The real config (after llama.cpp's clamping) that ``params`` measure."""
    settings: TrialSettings = space.suggest(optuna.trial.FixedTrial(params))  # type: ignore[arg-type]
    return config_key(normalize(settings)[0])


def setting_effects(cands: list[select.Candidate], objective: str) -> dict[str, float]:
    """Per setting, the largest effect one change of it had among ``cands`` (pairs of configs of one
    backend that differ in that setting alone): |log| of their speed ratio on ``objective``."""
    effects: dict[str, float] = {}
    for i, a in enumerate(cands):
        for b in cands[i + 1:]:
            if a.backend != b.backend:
                continue
            apart = [k for k in set(a.settings) | set(b.settings) if a.settings.get(k) != b.settings.get(k)]
            share = decision.share(a, b, objective)
            if len(apart) == 1 and share > 0:
                effects[apart[0]] = max(effects.get(apart[0], 0.0), abs(math.log(share)))
    return effects


def thread_settings(backend: str) -> list[str]:
    """The thread-count settings of ``backend`` (decode's first), each once."""
    names = backends.get(backend).thread_settings
    return list(dict.fromkeys(names[k] for k in ("decode", "prefill") if k in names))


def screen_order(backend: str, effects: dict[str, float] | None = None, busy: bool = False) -> list[str]:
    """The settings of ``backend`` to screen, in order: those a similar machine measured, largest effect
    first, then the backend's fixed order (binary switches first) for the rest. On a ``busy`` machine
    (:mod:`tuner.measure.load`) the thread counts come first: with a CPU kept busy by another process,
    fewer threads than CPUs may be the best config, and a quiet machine's order would screen them last."""
    fixed = list(backends.get(backend).screened)
    known = sorted((n for n in fixed if n in (effects or {})), key=lambda n: -(effects or {})[n])
    order = known + [n for n in fixed if n not in known]
    if not busy:
        return order
    threads = thread_settings(backend)
    return threads + [n for n in order if n not in threads]


def neighbours(space: ResolvedSpace, params: dict[str, Any], effects: dict[str, float] | None = None,
               busy: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
    """(setting, params) for every config one setting away from ``params``: the backend's screened
    settings first (:func:`screen_order`; on a ``busy`` machine its thread counts, fewer threads first),
    then the others in the space's order; nearest values first (:func:`_values`).
    The backend itself is never changed."""
    backend = params.get("backend", space.backends[0])
    first = [n for n in screen_order(backend, effects, busy) if n in params]
    for name in [*first, *(n for n in params if n not in first)]:
        current = params[name]
        if name == "backend":
            continue
        for value in _values(space.distributions[name], current, backend, name, busy):
            yield name, {**params, name: value}


def next_neighbour(space: ResolvedSpace, incumbent: dict[str, Any] | None, tried: Iterable[str],
                   excluded: dict[str, set[Any]] | None = None,
                   effects: dict[str, float] | None = None, busy: bool = False) -> tuple[str, dict[str, Any]] | None:
    """The first neighbour of ``incumbent`` (params) whose real config is not among the config keys
    ``tried`` and sets no value of ``excluded`` (setting -> values known to break a constraint):
    (the setting it changes, its params), or None at a local optimum (``busy``: :func:`neighbours`)."""
    if incumbent is None:
        return None
    seen = set(tried) | {key_of(space, incumbent)}
    for name, params in neighbours(space, incumbent, effects, busy):
        key = key_of(space, params)
        if key not in seen and params[name] not in (excluded or {}).get(name, ()):
            return name, params
        seen.add(key)  # two values may clamp to one config
    return None


def tried_keys(study: optuna.Study, space: ResolvedSpace) -> set[str]:
    """Config keys of every trial of ``study``: finished (any outcome), running, or queued. A finished
    trial counts both as the config that really ran and as the one its params asked for (the engine
    check may have changed a setting, e.g. repacking off where it crashes: asking again would only
    measure the same config again)."""
    keys = {rec.config_key for _, rec in select.records(study)}
    for trial in study.get_trials(deepcopy=False):
        fixed = asked_params(trial)
        try:
            keys.add(key_of(space, fixed))
        except (KeyError, ValueError):  # params of another space, or incomplete: not a config here
            pass
    return keys


def failed_quality(study: optuna.Study) -> dict[str, set[Any]]:
    """{"quant": weight types whose quality loss broke the run's guard}: a neighbour with them would
    only measure a config that cannot be recommended."""
    bad = {rec.settings["quant"] for _, rec in select.records(study)
           if "quant" in rec.settings and rec.violation.startswith("quality")}
    return {"quant": bad} if bad else {}


def enqueue_refinement(study: optuna.Study, space: ResolvedSpace, objective: str,
                       effects: dict[str, float] | None = None, busy: bool = False) -> str | None:
    """Queue :func:`next_refinement` (:func:`enqueue`); the setting it changes, or None when there is none."""
    step = next_refinement(study, space, objective, effects, busy)
    if step is None:
        return None
    enqueue(study, space, *step)
    return step[0]


def next_refinement(study: optuna.Study, space: ResolvedSpace, objective: str,
                    effects: dict[str, float] | None = None, busy: bool = False) -> tuple[str, dict[str, Any]] | None:
    """The next untried neighbour of the study's best in-space config (screened settings first, ordered by
    ``effects`` where a similar machine measured them): (the setting it changes, its params), or None when
    there is none (no incumbent yet, or all its neighbours were measured); on a ``busy`` machine the thread
    counts are screened first, fewer threads first (:func:`neighbours`). A weight type that broke the
    quality guard, or a change its backend knows would run the same program on this machine
    (:meth:`tuner.backends.base.Backend.same_program`), is not proposed."""
    cands = select.candidates(study)
    # The study's best config that the space can express (a baseline's defaults may lie outside it).
    best = decision.best(cands, objective, among=lambda c: params_of(space, c.settings) is not None)
    incumbent = params_of(space, best.settings) if best else None
    excluded = failed_quality(study)
    if incumbent is not None:  # a change that would run the same program here (repacking weights that do not repack)
        backend = backends.get(incumbent.get("backend", space.backends[0]))
        excluded.update(backend.same_program([rec for _, rec in select.records(study)], incumbent))
    return next_neighbour(space, incumbent, tried_keys(study, space), excluded, effects, busy)


def enqueue(study: optuna.Study, space: ResolvedSpace, name: str, params: dict[str, Any]) -> None:
    """Queue the neighbour ``params`` (changing setting ``name``) as the study's next trial, noted as a
    screening or local refinement step."""
    screened = name in backends.get(params.get("backend", space.backends[0])).screened
    study.enqueue_trial(params, user_attrs={REFINE_ATTR: name, SCREEN_ATTR: screened})
