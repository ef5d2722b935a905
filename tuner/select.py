"""Choosing among measured configs: pooled figures per real config, the Pareto front, named picks.

Trials that ran the same real config (same applicable settings after llama.cpp's clamping)
are pooled: their repetitions are summarized together, so a lucky single measurement does not win.

One exception: a config re-measured in the study's latest *confirmation stage* (the interleaved
re-measures that end a run, :mod:`tuner.remeasure`) is judged on that stage's figures alone. Its
search-time figures were what put it on the re-measure list, the best of many noisy draws, and
stay biased upward however many fresh samples are pooled with them (the winner's curse: the more
configs a long run tries, the luckier its best-looking one). The stage measured its configs side
by side, in alternating order, so they compare fairly; the recommendation is chosen among them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import optuna

from . import objectives
from .backends import DEFAULT
from .records import Stat, TrialRecord, record_of

PICKS = ("fastest_request", "balanced", "fastest_decode", "fastest_prefill", "leanest_memory")
LEAN_WITHIN = 0.9  # leanest_memory: the smallest peak among configs within 90% of the best balance
CONFIRM_ATTR = "autotune_confirm"  # Optuna user attribute: the confirmation stage a re-measure belongs to


@dataclass(frozen=True)
class Candidate:
    """One real config and everything measured for it."""

    config_key: str
    settings: dict[str, Any]
    trials: tuple[int, ...]
    roles: tuple[str, ...]
    prefill: Stat
    decode: Stat
    ttft: Stat | None
    peak_rss: int
    request: Stat | None = None  # seconds per request of the workload
    model: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0  # median wall time of one of its trials' child process
    confirmed: bool = False  # figures from the study's latest confirmation stage alone
    decode_depth: Stat | None = None  # tokens/s with the cache at the trial's depth (issue 29)

    @property
    def backend(self) -> str:
        """The config's backend."""
        return str(self.settings.get("backend", DEFAULT))

    @property
    def balanced(self) -> float:
        """Geometric mean of prefill and decode tokens/s."""
        return objectives.balanced(self)

    def score(self, objective: str) -> float:
        """The number ``objective`` ranks configs by, higher is better (:mod:`tuner.objectives`)."""
        return objectives.get(objective).score(self)

    def public(self) -> dict[str, Any]:
        """Plain data."""
        return {"config_key": self.config_key, "settings": self.settings, "trials": list(self.trials),
                "roles": list(self.roles), "prefill_tps": self.prefill.public(),
                "decode_tps": self.decode.public(),
                "ttft_s": self.ttft.public() if self.ttft else None,
                "request_s": self.request.public() if self.request else None, "peak_rss_bytes": self.peak_rss,
                "decode_depth_tps": self.decode_depth.public() if self.decode_depth else None,
                "model": self.model}


def records(study: optuna.Study) -> list[tuple[optuna.trial.FrozenTrial, TrialRecord]]:
    """Every finished trial of ``study`` that carries an autotune record."""
    out = []
    for trial in study.get_trials(deepcopy=False):
        rec = record_of(trial)
        if rec is not None:
            out.append((trial, rec))
    return out


def latest_stage(study: optuna.Study) -> str | None:
    """The study's latest confirmation stage (that of its highest-numbered re-measure), if any."""
    stages = [(t.number, t.user_attrs[CONFIRM_ATTR]) for t in study.get_trials(deepcopy=False)
              if t.user_attrs.get(CONFIRM_ATTR)]
    return max(stages)[1] if stages else None


def candidates(study: optuna.Study) -> list[Candidate]:
    """Feasible measured configs of ``study``, pooled by real config (a config of the latest
    confirmation stage with that stage's figures alone)."""
    stage = latest_stage(study)
    groups: dict[str, list[tuple[int, TrialRecord, bool]]] = {}
    for trial, rec in records(study):
        if rec.feasible and rec.prefill and rec.decode:
            in_stage = stage is not None and trial.user_attrs.get(CONFIRM_ATTR) == stage
            groups.setdefault(rec.config_key, []).append((trial.number, rec, in_stage))
    return [_pooled(key, items) for key, items in groups.items()]


def _pooled(key: str, items: list[tuple[int, TrialRecord, bool]]) -> Candidate:
    """One candidate from its trials: the figures of its confirmation-stage trials when it has any."""
    confirmed = any(in_stage for _, _, in_stage in items)
    used = [(n, r) for n, r, in_stage in items if in_stage or not confirmed]
    recs = [r for _, r in used]
    ttft_samples = [s for r in recs if r.ttft for s in r.ttft.samples]
    request_samples = [s for r in recs if r.request for s in r.request.samples]
    return Candidate(
        config_key=key, settings=recs[-1].settings, trials=tuple(n for n, _ in used),
        roles=tuple(sorted({r.role for _, r, _ in items})),
        prefill=Stat.of([s for r in recs for s in r.prefill.samples]),  # type: ignore[union-attr,arg-type]
        decode=Stat.of([s for r in recs for s in r.decode.samples]),  # type: ignore[union-attr,arg-type]
        ttft=Stat.of(ttft_samples), request=Stat.of(request_samples),
        peak_rss=max(r.outcome.memory.peak_rss for _, r, _ in items),
        model=recs[-1].model, extra=recs[-1].extra,
        wall_s=statistics.median(r.outcome.wall_s for _, r, _ in items), confirmed=confirmed,
        decode_depth=Stat.of([s for r in recs if r.decode_depth for s in r.decode_depth.samples]))


def judged(cands: list[Candidate]) -> list[Candidate]:
    """The configs a recommendation is chosen from: those of the latest confirmation stage, measured side
    by side, unless that stage confirmed nothing but a baseline (then every config)."""
    confirmed = [c for c in cands if c.confirmed]
    if len(confirmed) >= 2 or (confirmed and "baseline" not in confirmed[0].roles):
        return confirmed
    return cands


def baseline(cands: list[Candidate], backend: str = DEFAULT) -> Candidate | None:
    """The pooled baseline config of ``backend`` (the engine's own defaults), if measured."""
    for cand in cands:
        if "baseline" in cand.roles and cand.backend == backend:
            return cand
    return None


def pareto_front(cands: list[Candidate]) -> list[Candidate]:
    """Configs no other config beats on both prefill and decode, fastest decode first."""
    front = [c for c in cands if not any(
        o.prefill.median >= c.prefill.median and o.decode.median >= c.decode.median
        and (o.prefill.median > c.prefill.median or o.decode.median > c.decode.median) for o in cands)]
    return sorted(front, key=lambda c: -c.decode.median)


def picks(cands: list[Candidate]) -> dict[str, Candidate]:
    """The named picks, each a real measured config: balanced, fastest decode and prefill, leanest."""
    if not cands:
        return {}
    best_balance = max(c.balanced for c in cands)
    lean_pool = [c for c in cands if c.balanced >= LEAN_WITHIN * best_balance]
    return {
        "fastest_request": best(cands, "request_time") or cands[0],
        "balanced": max(cands, key=lambda c: c.balanced),
        "fastest_decode": max(cands, key=lambda c: c.decode.median),
        "fastest_prefill": max(cands, key=lambda c: c.prefill.median),
        "leanest_memory": min(lean_pool, key=lambda c: (c.peak_rss, -c.balanced)),
    }


def best(cands: list[Candidate], objective: str, targets: Any = None) -> Candidate | None:
    """The recommended config for ``objective``.

    Only the configs of the latest confirmation stage compete when there is one (:func:`judged`).
    Configs within the measured spread of the top score are a tie, broken toward the config that
    changes fewest settings from its backend's defaults (the baseline), then by score. For an
    objective with several values (pareto) only configs on the Pareto front are candidates, so the
    recommendation is always one of the front's configs.

    ``targets`` (:class:`tuner.targets.Targets`): the best-quality config meeting them instead, None
    when none does.
    """
    if not cands:
        return None
    judge = objectives.get(objective)
    pool = judged(cands)
    if targets is not None and targets.active:  # issue 29 targets hook: all logic in tuner.targets
        from .targets import pick

        return pick(pool, targets, objective) or pick(cands, targets, objective)
    pool = pareto_front(pool) if judge.multi else pool
    top = max(pool, key=lambda c: c.score(objective))
    tied = [c for c in pool if c.config_key == top.config_key or judge.tied(c, top)]
    return min(tied, key=lambda c: (changed_settings(c, baseline(cands, c.backend)), -c.score(objective)))


def changed_settings(cand: Candidate, base: Candidate | None) -> int:
    """How many settings ``cand`` changes from ``base`` (its backend's defaults); 0 without a baseline."""
    if base is None:
        return 0
    return sum(1 for k, v in cand.settings.items() if base.settings.get(k) != v)


def top(cands: list[Candidate], objective: str, n: int) -> list[Candidate]:
    """Up to ``n`` distinct configs worth re-measuring: the recommended one, then its runners-up by
    ``objective`` (the configs a noisy winner may have beaten by luck)."""
    chosen: list[Candidate] = []
    for cand in [best(cands, objective), *sorted(cands, key=lambda c: -c.score(objective))]:
        if cand is not None and cand.config_key not in {c.config_key for c in chosen}:
            chosen.append(cand)
    return chosen[:n]
