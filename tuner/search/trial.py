"""One trial from config to stored record: checks before running, the isolated run, the record."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from dataclasses import replace
from typing import Any

import optuna
from optuna.trial import TrialState

from .. import backends
from ..backends.roofline import decode_roofline
from ..backends.settings import TrialSettings, applicable, config_key, infeasible_reason, normalize
from ..config import objectives
from ..config.model import ModelInfo
from ..errors import AutotuneError
from ..measure import disturbance, load as machine_load, records as R
from ..measure.lock import machine_lock
from ..measure.runner import run_child
from ..util.processes import ending_by
from ..measure.spec import TrialSpec
from ..results.studies import PENDING_ATTR, mark_failed
from .state import DEADLINE_REASON, TrialContext
from .stopping import adaptive_rule, on_repetition
from .weights import Prepared, precheck, prepare, quality_facts


def fault_for(number: int) -> str | None:
    """The fault-injection hook (tests): ``AUTOTUNE_FAULT=kind``, ``kind:trial_number``, or a comma list."""
    for spec in filter(None, os.environ.get("AUTOTUNE_FAULT", "").split(",")):
        kind, _, at = spec.partition(":")
        if kind in backends.child_faults():  # not a fault of one trial: the backend's engine acts on it in every child
            continue
        if not at or int(at) == number:
            return kind
    return None


def decode_efficiency(model: ModelInfo, bandwidth_gbs: float | None, settings: TrialSettings, weight_bytes: int,
                      result: R.TrialResult) -> dict[str, float]:
    """The figures of :func:`tuner.backends.roofline.decode_roofline` a trial record keeps, from a child's
    ``result`` (its ``decode_tps`` samples) and the size of the weights file actually run; empty where there is none."""
    decode = R.Stat.of(result.decode_tps)
    roof = decode_roofline(settings.backend, model.public(), applicable(settings), weight_bytes,
                           result.prompt_tokens, result.generate_tokens, decode.median if decode else None,
                           bandwidth_gbs)
    return roof.facts() if roof else {}


SWEPT_ROLES = (R.Role.BASELINE, R.Role.REMEASURE, R.Role.REFERENCE)  # serve: a capacity sweep after the windows
MIN_WORK_S = 5.0  # no weights are made, probed or scored for a trial with less than this left before the deadline


def _too_late(ctx: TrialContext, cut_at_deadline: bool) -> bool:
    """Whether a trial held to the run's deadline has too little time left to start its costly steps
    (quantizing, the engine probe, perplexity and KL): waiting for the machine lock counts like any other time."""
    return cut_at_deadline and ctx.deadline is not None and ctx.deadline - time.monotonic() < MIN_WORK_S


def _past_deadline(ctx: TrialContext, cut_at_deadline: bool) -> bool:
    """Whether a trial held to the run's deadline has reached it (a child of its preparation was killed there)."""
    return cut_at_deadline and ctx.deadline is not None and time.monotonic() >= ctx.deadline


def _execute(ctx: TrialContext, trial: optuna.Trial, prepared: Prepared, role: str,
             repetitions: int | None, timeout_s: float | None,
             cut_at_deadline: bool, adaptive: bool = False,
             outclassed_by: float | None = None, outclassed_disturbed: float | None = None,
             max_wait_s: float | None = None) -> tuple[R.TrialOutcome, str, dict[str, Any]]:
    """Check quality and feasibility, then run the child: (outcome, violation, quality).

    The child runs at most ``timeout_s`` (the run's trial timeout by default) and, when
    ``cut_at_deadline``, never past the run's deadline: a child stopped there keeps the
    repetitions it finished (status ``cut``), or is ``interrupted`` if it finished none.
    An ``adaptive`` trial (the search's) runs as many repetitions as its spread needs
    (:func:`tuner.search.stopping.adaptive_rule`) and is stopped early when the pruner says it cannot
    win (status ``pruned``, keeping its figures); with ``outclassed_by`` (the best config's score so far)
    a trial stops after a repetition that scores under half of it (a disturbed one: under
    ``outclassed_disturbed`` of it, :func:`tuner.search.stopping._outclassed`). ``max_wait_s``: what the
    child may wait for a quiet machine in all (the run's share left, :mod:`tuner.measure.load`; None: the
    per-trial cap alone).
    """
    timeout = min(timeout_s or ctx.timeout_s, ctx.timeout_s)
    settings, model_path = prepared.settings, prepared.model_path
    if prepared.unusable:
        return R.TrialOutcome(status=R.ERROR, reason=prepared.unusable), "", {}
    early = infeasible_reason(settings, ctx.workload.needed_ctx())
    if early:  # before the quality step: it would measure weights this config never runs
        return R.TrialOutcome(status=R.INFEASIBLE, reason=early), early, {}
    if _too_late(ctx, cut_at_deadline):  # perplexity and KL take seconds to minutes: not past the deadline
        return R.TrialOutcome(status=R.INTERRUPTED, reason=DEADLINE_REASON), "", {}
    with ending_by(ctx.deadline if cut_at_deadline else None):  # perplexity and KL stop at the deadline
        quality, violation = quality_facts(ctx, settings)
    if _past_deadline(ctx, cut_at_deadline):
        return R.TrialOutcome(status=R.INTERRUPTED, reason=DEADLINE_REASON), "", {}
    pre = precheck(ctx, settings, prepared.model_facts)
    if pre:
        return R.TrialOutcome(status=R.INFEASIBLE, reason=pre), pre, quality
    reps = repetitions or ctx.repetitions
    spec = TrialSpec.of(model_path, settings, ctx.workload, reps, fault=fault_for(trial.number),
                        capacity=ctx.workload.kind == "serve" and role in SWEPT_ROLES,
                        adaptive=adaptive_rule(reps) if adaptive else None,
                        max_wait_s=None if max_wait_s is None else round(max(max_wait_s, 0.0), 3),
                        max_timed_s=None if ctx.workload.kind == "serve" else ctx.timed_cap_s)

    def tick() -> None:
        ctx.storage.heartbeat(trial)

    tick()
    # Making weights can run long on first use; the child never runs past the run's deadline.
    left = ctx.deadline - time.monotonic() if ctx.deadline is not None and cut_at_deadline else timeout
    if left < 1:
        return R.TrialOutcome(status=R.INTERRUPTED, reason=DEADLINE_REASON), violation, quality
    ctx.progress.trial_started(trial.number, role, applicable(settings), 0.0)
    outcome = run_child(spec, timeout_s=min(timeout, left), memory_ceiling=ctx.memory_ceiling, tick=tick,
                        on_repetition=on_repetition(ctx, trial, adaptive, outclassed_by, outclassed_disturbed))
    if outcome.status == R.TIMEOUT:
        outcome = _timed_out(outcome, left < timeout, spec.repetitions)
    if outcome.status == R.OVER_CEILING:
        violation = outcome.reason
    return outcome, violation, quality


def _timed_out(outcome: R.TrialOutcome, at_deadline: bool, repetitions: int) -> R.TrialOutcome:
    """A child stopped by its timeout: where that was the run's deadline (``at_deadline``) it keeps the
    repetitions it finished (``cut``), or is ``interrupted`` if it finished none; a trial timeout keeps nothing."""
    if not at_deadline:
        return replace(outcome, result=None)
    kept = outcome.measured()
    done = kept.repetitions if kept is not None else 0
    return replace(outcome, status=R.CUT, reason=f"{DEADLINE_REASON}; {done} of {repetitions} repetitions kept") \
        if done else replace(outcome, status=R.INTERRUPTED, reason=DEADLINE_REASON, result=None)


def _prepare_and_execute(ctx: TrialContext, trial: optuna.Trial, settings: TrialSettings, pending: dict[str, Any],
                         role: str, repetitions: int | None, timeout_s: float | None, cut_at_deadline: bool,
                         adaptive: bool, outclassed_by: float | None, outclassed_disturbed: float | None = None,
                         max_wait_s: float | None = None
                         ) -> tuple[TrialSettings, R.TrialOutcome, str, dict[str, Any]]:
    """Under the machine lock: the weights and engine check (:func:`prepare`), then :func:`_execute`;
    ``pending`` (the trial's stored intent) follows the settings that really run. Nothing is made once
    the wait for the lock has taken the time (:func:`_too_late`)."""
    if _too_late(ctx, cut_at_deadline):
        return settings, R.TrialOutcome(status=R.INTERRUPTED, reason=DEADLINE_REASON), "", {}
    with ending_by(ctx.deadline if cut_at_deadline else None):  # quantizing and its children stop at the deadline
        prepared = prepare(ctx, settings)
    if _past_deadline(ctx, cut_at_deadline):  # what a child killed at the deadline left is no fault of the config
        return settings, R.TrialOutcome(status=R.INTERRUPTED, reason=DEADLINE_REASON), "", {}
    pending["model"] = prepared.model_facts
    if prepared.settings != settings:
        settings = prepared.settings
        pending.update(settings=applicable(settings), config_key=config_key(settings),
                       notes=[*pending["notes"], *prepared.notes])
        with ctx.storage.errors():
            trial.set_user_attr(PENDING_ATTR, pending)
    return (settings, *_execute(ctx, trial, prepared, role, repetitions, timeout_s, cut_at_deadline, adaptive,
                                outclassed_by, outclassed_disturbed, max_wait_s))


def run_trial(ctx: TrialContext, trial: optuna.Trial, settings: TrialSettings, role: str,
              repetitions: int | None = None, extra_notes: tuple[str, ...] = (), timeout_s: float | None = None,
              cut_at_deadline: bool = True, adaptive: bool = False, outclassed_by: float | None = None,
              outclassed_disturbed: float | None = None, max_wait_s: float | None = None) -> R.TrialRecord:
    """Measure ``settings`` as Optuna ``trial``, store the record and tell the study.

    ``adaptive``: repetitions follow the spread and the pruner may stop the trial early;
    ``outclassed_by``: the best config's score so far, under half of which the trial stops after an
    undisturbed repetition (a disturbed one: under ``outclassed_disturbed`` of it); ``max_wait_s``: the
    seconds its child may wait for a quiet machine in all (see :func:`_execute`).

    A crash, hang or failure of the child is stored on a FAIL trial; a config over the
    memory ceiling or breaking a constraint is a COMPLETE trial with a violated constraint.
    The machine lock is held for the whole trial, quantization and perplexity included, since
    they load the CPU too. A KeyboardInterrupt stops the child, marks the trial interrupted
    and propagates.
    """
    settings, notes = normalize(settings)
    notes = [*extra_notes, *notes]
    key = config_key(settings)
    worker = worker_facts()
    pending: dict[str, Any] = {"role": role, "settings": applicable(settings), "config_key": key,
                               "notes": notes, "worker": worker}
    with ctx.storage.errors():
        trial.set_user_attr(PENDING_ATTR, pending)
    try:
        with machine_lock(on_wait=lambda: ctx.progress.status("waiting: another trial runs on this machine"),
                          deadline=ctx.deadline):
            settings, outcome, violation, quality = _prepare_and_execute(
                ctx, trial, settings, pending, role, repetitions, timeout_s, cut_at_deadline, adaptive, outclassed_by,
                outclassed_disturbed, max_wait_s)
            notes, key = pending["notes"], pending["config_key"]
    except BaseException as exc:
        status = R.INTERRUPTED if isinstance(exc, KeyboardInterrupt) else R.ERROR
        with contextlib.suppress(AutotuneError):  # the database itself may be what failed
            mark_failed(ctx.storage, ctx.storage.trial_id(trial), pending, status,
                        "autotune was interrupted" if status == R.INTERRUPTED else str(exc)[:500])
        raise
    model_facts = pending.get("model", {})
    result = outcome.measured() or R.TrialResult()
    disturbed = disturbance.summary(result.disturbance)
    bandwidth = ctx.bandwidth_for(settings.n_threads) if ctx.bandwidth_for else None
    efficiency = decode_efficiency(ctx.model_for(settings.backend), bandwidth, settings, model_facts.get("size_bytes", 0), result)
    record = R.TrialRecord(
        role=role, settings=applicable(settings), config_key=key, notes=tuple(notes), outcome=outcome,
        prefill=R.Stat.of(result.prefill_tps), decode=R.Stat.of(result.decode_tps),
        ttft=R.Stat.of(result.ttft_s), request=R.Stat.of(result.request_s),
        decode_depth=R.Stat.of(result.decode_depth_tps), goodput=R.Stat.of(result.goodput_tps),
        load_s=result.load_s, model=model_facts,
        worker=worker, violation=violation,
        extra={**quality, **efficiency, **_result_extra(result),
               **({disturbance.KEY: disturbed} if disturbed["repetitions"] else {}),
               **({machine_load.KEY: ctx.load} if ctx.load else {})})
    _tell(ctx, trial, record)
    return record


KEPT_AS_IS = ("chat", "timed_s")  # kept whenever the result has them
KEPT_IF_SET = ("serving", "capacity", "depth", "depth_n_past", "depth_decode_tokens", "depth_note",
               "once_s")  # once_s: setup no later trial of the same weights repeats (a dequantized copy kept)


def _result_extra(result: R.TrialResult) -> dict[str, Any]:
    """What a record keeps of the child's result beside its figures (a chat's turns, the timed seconds, the
    serve workload's figures and capacity sweep, the depth probe's facts, the MiB of weights repacked)."""
    out = {k: getattr(result, k) for k in KEPT_AS_IS if k in result.model_fields_set}
    out.update({k: getattr(result, k) for k in KEPT_IF_SET if getattr(result, k)})
    if result.repacked_mib is not None:
        out["repacked_mib"] = result.repacked_mib
    return out


def worker_facts() -> dict[str, Any]:
    """Which process handles a trial: host, pid, and when it started (a record's ``worker``)."""
    return {"host": platform.node(), "pid": os.getpid(), "started": time.time()}


def record_attr(record: R.TrialRecord) -> dict[str, Any]:
    """``record`` as the plain JSON data stored in the trial's user attribute ``R.RECORD_ATTR``."""
    return json.loads(json.dumps(record.public()))


def _tell(ctx: TrialContext, trial: optuna.Trial, record: R.TrialRecord) -> None:
    data = record_attr(record)
    try:
        with ctx.storage.errors():
            trial.set_user_attr(R.RECORD_ATTR, data)
            if record.outcome.status in R.FAILED_STATUSES:
                ctx.study.tell(trial, state=TrialState.FAIL)
                return
            if record.outcome.status in R.PARTIAL_STATUSES:  # pooled, but not a full value for TPE
                ctx.study.tell(trial, state=TrialState.PRUNED)
                return
            trial.set_constraint("violation", 1.0 if record.violation else (  # issue 29 targets hook
                ctx.targets.shortfall(record) if ctx.targets is not None and ctx.targets.active else 0.0))
            ctx.study.tell(trial, objectives.get(ctx.objective).values(record))
    except optuna.exceptions.UpdateFinishedTrialError:
        # Another worker took this trial for orphaned (e.g. after a long network partition).
        ctx.progress.status(f"trial {trial.number} was marked failed by another worker meanwhile; "
                            "its result is dropped")


