"""Targets a user states: a decode and prefill speed at least, a memory peak at most (issue 29).

With a target given, the question a run answers changes from "what is fastest" to "what is the
best quality that is fast enough": the pick is the config of the lowest KL divergence from the
source (:mod:`tuner.backends.llama_cpp.kl`) among those meeting every target, request time breaking ties. The source
weights count KL 0; a config whose KL was not measured ranks after every measured one.

Targets reach the sampler as an Optuna constraint (:meth:`Targets.shortfall` > 0 is infeasible, so
TPE learns where they are met). When no config meets them, :meth:`Targets.miss_message` says which
target the closest config missed and by how much, and :func:`explain` lists, for the closest configs,
the one-setting changes that were measured to move the missed figure the right way.

The pick itself is made by the one decision rule (:func:`tuner.selection.decision.best` with ``targets``); this
module says what meets the targets, what a config's quality is, and why nothing met them: the search's
constraint (:func:`tuner.search.trial._tell`) and the end of :func:`tuner.search.tune` call it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from collections.abc import Callable
from typing import Any

from ..errors import AutotuneError
from .. import backends
from ..measure.records import TrialRecord
from ..results.studies import OptunaError, Study
from ..util.units import format_bytes
from .candidates import Candidate

TARGETS_ATTR = "autotune_targets"  # study user attribute: the targets of the latest run
EXPLAIN_CONFIGS = 3  # --explain: the closest configs it explains


@dataclass(frozen=True)
class Targets:
    """Decode and prefill tokens/s at least, peak memory (bytes) at most; None: no such target.

    ``at_depth``: the decode target is judged on decode at depth (workloads that rank by it)."""

    min_decode: float | None = None
    min_prefill: float | None = None
    max_memory: int | None = None
    at_depth: bool = False

    @property
    def active(self) -> bool:
        """Whether any target is set."""
        return any(v is not None for v in (self.min_decode, self.min_prefill, self.max_memory))

    def public(self) -> dict[str, Any]:
        """Plain data (the study attribute)."""
        return asdict(self)

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> "Targets | None":
        """The targets stored on a study, if its latest run had any."""
        data = attrs.get(TARGETS_ATTR)
        return cls(**data) if data else None

    def decode_of(self, measured: Candidate | TrialRecord) -> float:
        """The decode figure a target is judged on (at depth when ``at_depth`` and measured)."""
        stat = getattr(measured, "decode_depth", None) if self.at_depth else None
        stat = stat or getattr(measured, "decode", None)
        return stat.median if stat is not None else 0.0

    def misses(self, measured: Candidate | TrialRecord) -> list[tuple[str, float, float, float]]:
        """The targets ``measured`` (a record or candidate) misses: (name, figure, target, shortfall),
        the shortfall relative to the target (0.25: a quarter short, or a quarter over for memory)."""
        out = []
        if self.min_decode is not None:
            got = self.decode_of(measured)
            if got < self.min_decode:
                out.append(("decode" + (" at depth" if self.at_depth else ""), got, self.min_decode,
                            1 - got / self.min_decode))
        if self.min_prefill is not None:
            stat = getattr(measured, "prefill", None)
            got = stat.median if stat is not None else 0.0
            if got < self.min_prefill:
                out.append(("prefill", got, self.min_prefill, 1 - got / self.min_prefill))
        if self.max_memory is not None:
            got = _peak(measured)
            if got > self.max_memory:
                out.append(("memory", got, self.max_memory, got / self.max_memory - 1))
        return out

    def feasible(self, measured: Candidate | TrialRecord) -> bool:
        """Whether ``measured`` meets every target."""
        return not self.misses(measured)

    def shortfall(self, measured: Candidate | TrialRecord) -> float:
        """The Optuna constraint value: the largest relative shortfall, 0 when every target is met."""
        return max((m[3] for m in self.misses(measured)), default=0.0)

    def miss_message(self, cands: list[Candidate]) -> str:
        """One line: the target the closest config missed, by how much, and that config."""
        near = closest(cands, self)
        if near is None:
            return "no config was measured: give a larger --budget"
        parts = [f"{name} {_fmt(name, got)} against the target {_fmt(name, want)} ({_by(name, got, want, short)})"
                 for name, got, want, short in self.misses(near)]
        return (f"no measured config meets the targets: the closest, trials {','.join(map(str, near.trials))} "
                f"({describe(near.settings)}), has {'; '.join(parts)}")


def _by(name: str, got: float, want: float, short: float) -> str:
    """How far a figure misses its target: "25% short", "40% over", or for memory ten times or more over
    it "12x the target" (not "1100% over")."""
    if name != "memory":
        return f"{short:.0%} short"
    return f"{short:.0%} over" if got < 10 * want else f"{got / want:,.0f}x the target"


def describe(settings: dict[str, Any]) -> str:
    """A config's main settings as ``backend quant=Q4_0 n_threads=2 ...``."""
    backend = backends.get(settings.get("backend"))
    keys = [k for k in backend.summary_keys if k in settings]
    return " ".join([backend.label, *(f"{k}={settings[k]}" for k in keys)])


def _peak(measured: Candidate | TrialRecord) -> int:
    if hasattr(measured, "peak_rss"):  # a candidate
        return int(measured.peak_rss)
    return int(measured.outcome.memory.peak_rss)


def _fmt(name: str, value: float) -> str:
    if name == "memory":
        return format_bytes(int(value))
    return f"{value:.1f} t/s"


def quality_key(cand: Candidate) -> float:
    """Lower is better: the mean KL divergence from the source (0 for the source weights; inf when
    not measured)."""
    kl = cand.extra.get("kl_mean") if getattr(cand, "extra", None) else None
    if kl is not None:
        return float(kl)
    return 0.0 if cand.settings.get("quant", "source") == "source" and "dtype" not in cand.settings else math.inf


def closest(cands: list[Candidate], targets: Targets) -> Candidate | None:
    """The config whose largest relative shortfall is the smallest."""
    return min(cands, key=lambda c: (targets.shortfall(c), quality_key(c)), default=None)


def explain(cands: list[Candidate], targets: Targets, n: int = EXPLAIN_CONFIGS) -> list[str]:
    """For the ``n`` closest configs: each measured change of one setting that moved a missed figure
    the right way (from the other measured configs that differ in that setting alone), best first."""
    lines = []
    for cand in sorted(cands, key=lambda c: (targets.shortfall(c), quality_key(c)))[:n]:
        misses = targets.misses(cand)
        if not misses:
            continue
        helps = []
        for other in cands:
            diff = [k for k in set(cand.settings) | set(other.settings)
                    if cand.settings.get(k) != other.settings.get(k)]
            if len(diff) != 1:
                continue
            for name, got, _, _ in misses:
                new = _figure(other, name, targets)
                gain = (got / new - 1) if name == "memory" and new else (new / got - 1 if got else math.inf)
                if gain > 0:
                    helps.append((gain, f"{diff[0]} {cand.settings.get(diff[0])} -> {other.settings.get(diff[0])}: "
                                        f"{name} {_fmt(name, got)} -> {_fmt(name, new)}"))
        head = f"trials {','.join(map(str, cand.trials))} (short by {targets.shortfall(cand):.0%})"
        body = "; ".join(text for _, text in sorted(helps, reverse=True)[:3]) or \
            "no measured one-setting change improves what it misses"
        lines.append(f"{head}: {body}")
    return lines


def _figure(cand: Candidate, name: str, targets: Targets) -> float:
    if name.startswith("decode"):
        return targets.decode_of(cand)
    if name == "prefill":
        return cand.prefill.median
    return float(_peak(cand))


def for_run(targets: Targets | None, study: Study, at_depth: bool) -> Targets | None:
    """A run's targets (decode judged at depth for a workload ranked there), stored on its study so
    that ``autotune best`` picks with them too; None without targets."""
    import contextlib

    active = replace(targets, at_depth=at_depth) if targets is not None and targets.active else None
    with contextlib.suppress(OptunaError, AutotuneError):  # a convenience, not a must
        study.set_user_attr(TARGETS_ATTR, active.public() if active else None)
    return active


def check_run(cands: list[Candidate], targets: Targets | None, objective: str,
              say: Callable[[str], None] | None = None) -> None:
    """At the end of a run with targets that no config meets: ``say`` each :func:`explain` line (when
    given, for --explain), then raise the one-line miss message (AutotuneError: exit 1)."""
    if targets is None or not targets.active or not cands or any(targets.feasible(c) for c in cands):
        return
    if say is not None:
        for line in explain(cands, targets):
            say(f"explain: {line}")
    raise AutotuneError(targets.miss_message(cands))
