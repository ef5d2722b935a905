"""What was measured, per real config: the candidates every choice is made among (:mod:`tuner.selection.decision`).

Trials that ran the same real config (same applicable settings after llama.cpp's clamping)
are pooled: their repetitions are summarized together, so a lucky single measurement does not win.

One exception: a config re-measured in the study's latest *confirmation stage* (the interleaved
re-measures that end a run, :mod:`tuner.search.remeasure`) is judged on that stage's figures alone. Its
search-time figures were what put it on the re-measure list, the best of many noisy draws, and
stay biased upward however many fresh samples are pooled with them (the winner's curse: the more
configs a long run tries, the luckier its best-looking one). The stage measured its configs side
by side, in alternating order, so they compare fairly; the recommendation is chosen among them. Only
the stage's complete rounds count (a round in which every config of the stage was measured), so every
confirmed config is judged on the same number of rounds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..config import objectives
from ..measure import disturbance
from ..backends import DEFAULT
from ..measure.records import OK, REPEAT, Stat, TrialRecord, record_of
from ..results.studies import FrozenTrial, Study

CONFIRM_ATTR = "autotune_confirm"  # Optuna user attribute: the confirmation stage a re-measure belongs to
ROUND_ATTR = "autotune_confirm_round"  # ... and its round (0, 1, ...) within that stage
ROUND_SIZE_ATTR = "autotune_confirm_round_size"  # ... and how many configs that round measures (a deciding
                                                 # round measures only the winner and its undecided rivals)


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
    wall_s: float = 0.0  # median wall time of one of its trials' child process, less one-off setup (once_s)
    confirmed: bool = False  # figures from the study's latest confirmation stage alone
    decode_depth: Stat | None = None  # tokens/s with the cache at the trial's depth (issue 29)
    goodput: Stat | None = None  # serve: output tokens/s of requests that met the targets (issue 43)
    reps: float = 0.0   # median timed repetitions of one of its trials (a search trial may stop early)
    rep_s: float = 0.0  # median seconds of one timed repetition

    def trial_s(self, repetitions: int) -> float:
        """The expected wall time of one trial of this config with ``repetitions`` timed repetitions: its
        typical trial's, with the repetitions it did not run (an adaptive search trial stops at two when they
        agree) added at their typical time."""
        return self.wall_s + max(0.0, repetitions - self.reps) * self.rep_s

    @property
    def backend(self) -> str:
        """The config's backend."""
        return str(self.settings.get("backend", DEFAULT))

    @property
    def balanced(self) -> float:
        """Geometric mean of prefill and decode tokens/s."""
        return objectives.balanced(self)

    def score(self, objective: str) -> float:
        """The number ``objective`` ranks configs by, higher is better (:mod:`tuner.config.objectives`)."""
        return objectives.get(objective).score(self)

    def public(self) -> dict[str, Any]:
        """Plain data."""
        return {"config_key": self.config_key, "settings": self.settings, "trials": list(self.trials),
                "roles": list(self.roles), "prefill_tps": self.prefill.public(),
                "decode_tps": self.decode.public(),
                "ttft_s": self.ttft.public() if self.ttft else None,
                "request_s": self.request.public() if self.request else None, "peak_rss_bytes": self.peak_rss,
                "decode_depth_tps": self.decode_depth.public() if self.decode_depth else None,
                "goodput_tps": self.goodput.public() if self.goodput else None,
                "model": self.model}


def records(study: Study) -> list[tuple[FrozenTrial, TrialRecord]]:
    """Every finished trial of ``study`` that carries an autotune record of a measurement (a TPE sample told
    a measured config's figures, status ``repeat``, measured nothing and is left out)."""
    out = []
    for trial in study.get_trials(deepcopy=False):
        rec = record_of(trial)
        if rec is not None and rec.outcome.status != REPEAT:
            out.append((trial, rec))
    return out


def latest_stage(study: Study) -> str | None:
    """The study's latest confirmation stage (that of its highest-numbered re-measure), if any."""
    stages = [(t.number, t.user_attrs[CONFIRM_ATTR]) for t in study.get_trials(deepcopy=False)
              if t.user_attrs.get(CONFIRM_ATTR)]
    return max(stages)[1] if stages else None


def complete_rounds(study: Study, stage: str | None) -> set[int] | None:
    """The rounds of ``stage`` in which every config of the round has a complete trial (None: the stage's
    trials carry no rounds, as before rounds were recorded, and all of them count). A round measures every
    config of the stage unless its trials say how many it measures (``ROUND_SIZE_ATTR``)."""
    if stage is None:
        return None
    trials = [(t, record_of(t)) for t in study.get_trials(deepcopy=False) if t.user_attrs.get(CONFIRM_ATTR) == stage]
    if not any(ROUND_ATTR in t.user_attrs for t, _ in trials):
        return None
    configs = {rec.config_key for _, rec in trials if rec is not None}
    done: dict[int, set[str]] = {}
    size: dict[int, int] = {}
    for trial, rec in trials:
        if ROUND_ATTR in trial.user_attrs:
            number = int(trial.user_attrs[ROUND_ATTR])
            size[number] = int(trial.user_attrs.get(ROUND_SIZE_ATTR, len(configs)))
            if rec is not None and rec.outcome.status == OK:
                done.setdefault(number, set()).add(rec.config_key)
    return {r for r, keys in done.items() if len(keys) >= size[r]}


def candidates(study: Study) -> list[Candidate]:
    """Feasible measured configs of ``study``, pooled by real config (a config of the latest
    confirmation stage with the figures of that stage's complete rounds alone)."""
    stage = latest_stage(study)
    rounds = complete_rounds(study, stage)
    if rounds is not None and not rounds:
        stage = None  # no round of the stage completed: it decides nothing, its trials pool as usual
    groups: dict[str, list[tuple[int, TrialRecord, bool]]] = {}
    for trial, rec in records(study):
        if rec.feasible and rec.prefill and rec.decode:
            in_stage = stage is not None and trial.user_attrs.get(CONFIRM_ATTR) == stage
            if in_stage and rounds is not None and trial.user_attrs.get(ROUND_ATTR) not in rounds:
                continue  # an incomplete round of the stage: not a side-by-side figure
            groups.setdefault(rec.config_key, []).append((trial.number, rec, in_stage))
    return [_pooled(key, items) for key, items in groups.items()]


def _pooled(key: str, items: list[tuple[int, TrialRecord, bool]]) -> Candidate:
    """One candidate from its trials: the figures of its confirmation-stage trials when it has any."""
    confirmed = any(in_stage for _, _, in_stage in items)
    used = [(n, r) for n, r, in_stage in items if in_stage or not confirmed]
    recs = [r for _, r in used]
    figures = {name: Stat.of(disturbance.undisturbed(recs, name))  # its quiet repetitions, where it has any
               for name in ("prefill", "decode", "ttft", "request", "decode_depth", "goodput")}
    return Candidate(
        config_key=key, settings=recs[-1].settings, trials=tuple(n for n, _ in used),
        roles=tuple(sorted({r.role for _, r, _ in items})), **figures,  # type: ignore[arg-type]
        peak_rss=max(r.outcome.memory.peak_rss for _, r, _ in items),
        model=recs[-1].model, extra=recs[-1].extra,
        wall_s=statistics.median(_repeatable_wall(r) for _, r, _ in items), confirmed=confirmed,
        **_repetition_times([r for _, r, _ in items]))


def _repeatable_wall(rec: TrialRecord) -> float:
    """A trial's wall seconds less its one-off setup (``once_s``: a dequantized copy made for later trials):
    what measuring the config again costs."""
    return max(rec.outcome.wall_s - float(rec.extra.get("once_s") or 0.0), 0.0)


def _repetition_times(recs: list[TrialRecord]) -> dict[str, float]:
    """{"reps", "rep_s"}: the median timed repetitions per trial and seconds per repetition of ``recs``
    (empty where no trial recorded its timed seconds)."""
    timed = [(r.request.n, r.extra["timed_s"] / r.request.n) for r in recs
             if r.request and r.request.n and r.extra.get("timed_s")]
    if not timed:
        return {}
    return {"reps": statistics.median(n for n, _ in timed), "rep_s": statistics.median(t for _, t in timed)}
