"""Does a stored recommendation still hold on this machine? Re-measure it against its baseline.

The recommended config and its baseline (the engine's defaults) run again, interleaved over a few
rounds (A B, B A, ...) so a drift of the machine's speed hits both, each trial in its own child
process as ``autotune run`` measures. The recommendation holds when it still beats the baseline
(its request time is shorter; tokens/s where no request time is stored) and its own figures sit
within the stored spread (or ``tolerance``) of what the file claims. A llama-cpp-python upgrade,
a kernel change or a move to another machine can break either: ``autotune check`` then exits 1
with one line, a regression check for CI.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..selection import decision
from ..config import objectives
from ..measure import records as R
from ..errors import AutotuneError
from .document import load
from ..measure.rounds import interleaved
from ..measure.lock import machine_lock
from ..measure.runner import run_child
from ..measure.spec import TrialSpec
from ..backends.settings import TrialSettings, normalize

DEFAULT_ROUNDS = 2
MIN_TOLERANCE = 0.10  # machines drift by this much between runs even when nothing changed
CHECK_TIMEOUT_S = 600


@dataclass
class CheckResult:
    """What the re-measurement found: medians now, the stored claims, and the verdict."""

    ok: bool
    reason: str
    now: dict[str, dict[str, float]] = field(default_factory=dict)     # role -> figure -> median
    stored: dict[str, dict[str, float]] = field(default_factory=dict)
    tolerance: float = MIN_TOLERANCE


def _stored(figures: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, name in (("prefill_tps", "prefill"), ("decode_tps", "decode"), ("request_s", "request")):
        stat = figures.get(key)
        if stat:
            out[name] = float(stat["median"])
    return out


FIGURES = (("prefill_tps", "prefill"), ("decode_tps", "decode"), ("request_s", "request"))


def _samples(outcomes: list[R.TrialOutcome]) -> dict[str, list[float]]:
    """Every repetition's figures of ``outcomes``, by figure name."""
    ok = [o.result for o in outcomes if o.ok and o.result]
    out = {}
    for key, name in FIGURES:
        samples = [v for r in ok for v in r.get(key, [])]
        if samples:
            out[name] = samples
    return out


@dataclass(frozen=True)
class _Measured:
    """A role's figures now, in the shape :mod:`tuner.selection.decision` compares."""

    prefill: R.Stat | None
    decode: R.Stat | None
    request: R.Stat | None

    @classmethod
    def of(cls, figures: dict[str, float | list[float]]) -> "_Measured":
        def stat(name: str) -> R.Stat | None:
            value = figures.get(name)
            return R.Stat.of(value if isinstance(value, list) else [value]) if value is not None else None
        return cls(prefill=stat("prefill"), decode=stat("decode"), request=stat("request"))


def _median(value: float | list[float]) -> float:
    return statistics.median(value) if isinstance(value, list) else value


def _spec(doc: dict[str, Any], settings: dict[str, Any], model_path: str, repetitions: int) -> TrialSpec:
    real, _ = normalize(TrialSettings(**settings))
    return TrialSpec.of(model_path, real, doc["workload"], repetitions)


def _tolerance(doc: dict[str, Any], given: float | None) -> float:
    if given is not None:
        return given
    cvs = [doc["figures"][k]["cv"] for k in ("prefill_tps", "decode_tps", "request_s") if doc["figures"].get(k)]
    return max([MIN_TOLERANCE, *(3 * cv for cv in cvs)])


def verdict(now: dict[str, dict[str, Any]], stored: dict[str, float], tolerance: float,
            is_baseline: bool = False, objective: str = objectives.DEFAULT) -> tuple[bool, str]:
    """(holds, one line): the recommendation beats its baseline now on ``objective`` by the decision rule
    (:func:`tuner.selection.decision.compare`; a tie does not beat it), unless it is the baseline, and is within
    ``tolerance`` of its stored figures. ``now`` holds, per role, each figure's samples (or a median)."""
    rec_figures, base_figures = now.get("recommended", {}), now.get("baseline", {})
    if not rec_figures:
        return False, "the recommended config no longer runs on this machine (no repetition completed)"
    rec = {name: _median(value) for name, value in rec_figures.items()}
    base = {name: _median(value) for name, value in base_figures.items()}
    if "request" not in rec or "request" not in base:
        objective = "balanced"  # an older file without request times: the geometric mean of the tokens/s
    if not is_baseline and base_figures:
        seen = decision.compare(_Measured.of(rec_figures), _Measured.of(base_figures), objective)
        if seen.verdict in (decision.WORSE, decision.TIED) or (seen.verdict == decision.UNDECIDED and seen.ratio < 1):
            said = (f"a request takes {rec['request']:.2f} s against {base['request']:.2f} s with the defaults"
                    if objective == "request_time" else f"{seen.ratio:.2f}x the defaults' {objective} figure")
            return False, f"the recommendation no longer beats the defaults: {said}"
    for name, unit, slower in (("request", "s", lambda a, b: a > b * (1 + tolerance)),
                               ("decode", "tok/s", lambda a, b: a < b / (1 + tolerance)),
                               ("prefill", "tok/s", lambda a, b: a < b / (1 + tolerance))):
        if name in rec and name in stored and slower(rec[name], stored[name]):
            change = rec[name] / stored[name] - 1
            return False, (f"{name} is {rec[name]:.2f} {unit} now against the stored {stored[name]:.2f} {unit} "
                           f"({change:+.0%}, tolerance {tolerance:.0%}): run `autotune run` again")
    return True, "the recommendation holds: it beats the defaults and matches its stored figures"


def check(path: Path | str | dict[str, Any], *, rounds: int = DEFAULT_ROUNDS, repetitions: int = 3,
          tolerance: float | None = None, on_status: Any = None) -> CheckResult:
    """Re-measure the recommendation at ``path`` (or a recommendation document) and its baseline,
    interleaved over ``rounds``; ``tolerance`` (0.1 = 10%) defaults to 3x the stored spread, at least 10%."""
    doc = path if isinstance(path, dict) else load(path)
    named = f"the recommendation of study {doc.get('study', '?')}" if isinstance(path, dict) else str(path)
    if "baseline" not in doc:
        raise AutotuneError(f"{named} has no baseline to compare with: it was written before its baseline ran")
    source = doc["model"]["path"]
    chosen_path = (doc["model"].get("variant") or {}).get("path") or source
    for file in {source, chosen_path}:
        if not Path(file).is_file():
            raise AutotuneError(f"the model {file} named in {named} is gone: run `autotune run` again")
    specs = {"recommended": _spec(doc, doc["settings"], chosen_path, repetitions),
             "baseline": _spec(doc, doc["baseline"]["settings"], source, repetitions)}
    say = on_status or (lambda _text: None)
    outcomes: dict[str, list[R.TrialOutcome]] = {name: [] for name in specs}
    for r, name in interleaved(list(specs), rounds):
        say(f"round {r + 1}/{rounds}: {name}")
        with machine_lock():
            outcomes[name].append(run_child(specs[name], timeout_s=CHECK_TIMEOUT_S, memory_ceiling=None))
    samples = {name: _samples(outs) for name, outs in outcomes.items()}
    stored = _stored(doc["figures"])
    tol = _tolerance(doc, tolerance)
    ok, reason = verdict(samples, stored, tol, is_baseline=doc["settings"] == doc["baseline"]["settings"],
                         objective=doc.get("objective", objectives.DEFAULT))
    now = {role: {name: statistics.median(values) for name, values in figures.items()}
           for role, figures in samples.items()}
    return CheckResult(ok=ok, reason=reason, now=now,
                       stored={"recommended": stored, "baseline": _stored(doc["baseline"]["figures"])}, tolerance=tol)
