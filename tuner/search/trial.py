"""One trial from config to stored record: checks before running, the isolated run, the record."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import optuna
from optuna.trial import TrialState

from .. import backends
from ..measure import disturbance
from ..config import objectives
from ..measure import records as R
from ..backends.llama_cpp.engine import REPACK_CRASH_FAULT
from ..errors import AutotuneError
from ..backends.llama_cpp.health import EngineHealth
from ..config.model import ModelInfo
from .progress import Progress
from ..measure.runner import machine_lock, run_child
from ..backends.settings import TrialSettings, applicable, config_key, infeasible_reason, normalize
from ..results.storage import Storage
from ..results.studies import PENDING_ATTR
from ..config.workloads import Workload

MEMORY_OVERHEAD = 64 * 1024**2  # interpreter, llama.cpp buffers: below this a config clearly fails
DEADLINE_REASON = "stopped at the run's deadline (the budget plus its grace), not a fault of this config"
QUALITY_TOKENS = 1024  # eval-text tokens scored for perplexity: loss ratios settle well before this


@dataclass(frozen=True)
class TrialContext:
    """What every trial of a run shares."""

    storage: Storage
    study: optuna.Study
    model: ModelInfo
    workload: Workload
    objective: str
    repetitions: int
    memory_ceiling: int
    timeout_s: float
    progress: Progress
    max_quality_loss: float | None = None
    bandwidth_for: Callable[[int | None], float | None] | None = None  # MachineProfile.bandwidth_for
    quality_guard: bool = False
    variants: dict[str, Any] = field(default_factory=dict)  # ready-made quant files (--model-dir)
    deadline: float | None = None  # time.monotonic() by which a child must end: the budget plus its grace
    health: EngineHealth | None = None  # repacking verdicts of this machine's engine
    targets: Any = None  # issue 29: tuner.selection.targets.Targets, told to TPE as a constraint
    max_kl: float | None = None  # issue 29: largest mean KL divergence (nats/token) from the source


def _fault_for(number: int) -> str | None:
    """The fault-injection hook (tests): ``AUTOTUNE_FAULT=kind``, ``kind:trial_number``, or a comma list."""
    for spec in filter(None, os.environ.get("AUTOTUNE_FAULT", "").split(",")):
        kind, _, at = spec.partition(":")
        if kind == REPACK_CRASH_FAULT:  # not a fault of one trial: tuner.backends.llama_cpp.engine acts on it in every child
            continue
        if not at or int(at) == number:
            return kind
    return None


def _model_for(ctx: TrialContext, settings: TrialSettings) -> tuple[dict[str, Any], str | None, str | None]:
    """The model file a config runs on: (model facts, path, why unusable / quality violation)."""
    if not backends.get(settings.backend).weight_variants or settings.quant == "source":
        return {"path": ctx.model.path, "quant": "source", "file_type": ctx.model.file_type,
                "size_bytes": ctx.model.size_bytes}, ctx.model.path, None
    from ..backends.llama_cpp.quant import check_quant_name, ensure_variant

    variant = ctx.variants.get(check_quant_name(settings.quant)) or \
        ensure_variant(ctx.model, settings.quant, on_status=ctx.progress.status)
    facts = {"path": variant.path, "quant": variant.quant, "file_type": variant.quant,
             "size_bytes": variant.size_bytes, "requantized": variant.requantized,
             "source_file_type": variant.source_file_type, "created_s": variant.created_s}
    if variant.error:
        return facts, None, f"quantization to {settings.quant} failed: {variant.error}"
    return facts, variant.path, None


def _quality(ctx: TrialContext, settings: TrialSettings) -> tuple[dict[str, Any], str]:
    """Quality figures of the config's weights and a violation if the loss is too large.

    Measured (once per weight file, then cached) only when the run guards quality, i.e. the
    space searches quant types and ``max_quality_loss`` or ``max_kl`` is set: perplexity, and the
    KL divergence and top-token agreement against the source (:mod:`tuner.backends.llama_cpp.kl`).
    """
    if not ctx.quality_guard or (ctx.max_quality_loss is None and ctx.max_kl is None) \
            or not backends.get(settings.backend).weight_variants:
        return {}, ""
    from ..backends.llama_cpp.quality import is_measured, measure_quality, quality_ok
    from ..backends.llama_cpp.quant import check_quant_name, ensure_variant

    variant = ctx.variants.get(check_quant_name(settings.quant)) or ensure_variant(ctx.model, settings.quant)
    if not is_measured(variant, ctx.model, max_tokens=QUALITY_TOKENS):  # said only when it takes time
        ctx.progress.status(f"perplexity of {settings.quant} on the evaluation text")
    quality = measure_quality(variant, ctx.model, max_tokens=QUALITY_TOKENS)
    facts = {"perplexity": quality.perplexity, "reference_perplexity": quality.reference_perplexity,
             "quality_loss": quality.loss}
    if quality.error:
        return facts, f"quality of {settings.quant} could not be measured: {quality.error}"
    facts, kl_violation = _divergence(ctx, settings, variant, facts)
    if ctx.max_quality_loss is not None and not quality_ok(quality, ctx.max_quality_loss):
        return facts, (f"quality loss {quality.loss:+.1%} of {settings.quant} exceeds the "
                       f"allowed {ctx.max_quality_loss:.1%}")
    return facts, kl_violation


def _divergence(ctx: TrialContext, settings: TrialSettings, variant: Any,
                facts: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """KL divergence and top-token agreement of the config's weights (issue 29), and a violation
    when the mean KL is over ``--max-kl``."""
    from ..backends.llama_cpp.kl import is_measured, kl_ok, measure_divergence

    if not is_measured(variant, ctx.model, max_tokens=QUALITY_TOKENS):
        ctx.progress.status(f"KL divergence of {settings.quant} against the source")
    divergence = measure_divergence(variant, ctx.model, max_tokens=QUALITY_TOKENS)
    facts = {**facts, **divergence.facts()}
    if ctx.max_kl is not None and divergence.error:
        return facts, f"KL divergence of {settings.quant} could not be measured: {divergence.error}"
    if not kl_ok(divergence, ctx.max_kl):
        return facts, (f"KL divergence {divergence.kl_mean:.4f} of {settings.quant} exceeds the allowed "
                       f"{ctx.max_kl:g} nats per token (--max-kl)")
    return facts, ""


def _precheck(ctx: TrialContext, settings: TrialSettings, model_facts: dict[str, Any]) -> str:
    reason = infeasible_reason(settings, ctx.workload.needed_ctx())
    if reason:
        return reason
    need = backends.get(settings.backend).memory_needed(ctx.model, settings, model_facts["size_bytes"])
    if need + MEMORY_OVERHEAD > ctx.memory_ceiling:
        return (f"needs at least {need + MEMORY_OVERHEAD} bytes (weights + KV cache) but the memory "
                f"ceiling is {ctx.memory_ceiling}")
    return ""


def decode_efficiency(model: ModelInfo, bandwidth_gbs: float | None, settings: TrialSettings, weight_bytes: int,
                      result: dict[str, Any]) -> dict[str, float]:
    """Decode speed against the memory-bandwidth roofline: each token reads all weights and the KV cache.

    ``model`` gives the KV bytes per token, ``weight_bytes`` is the size of the GGUF actually run
    (the quant variant's file), ``result`` a child's raw result with ``decode_tps`` samples.
    Empty for a backend without a roofline model or when no bandwidth was measured.
    """
    if not result.get("decode_tps") or not bandwidth_gbs:
        return {}
    import statistics

    mean_ctx = result.get("prompt_tokens", 0) + result.get("generate_tokens", 0) / 2
    bytes_per_token = backends.get(settings.backend).decode_bytes_per_token(
        model.public(), applicable(settings), weight_bytes, mean_ctx)
    if bytes_per_token is None:
        return {}
    tps = statistics.median(result["decode_tps"])
    return {"decode_bytes_per_token": round(bytes_per_token), "decode_bandwidth_gbs": bandwidth_gbs,
            "decode_efficiency": round(tps * bytes_per_token / (bandwidth_gbs * 1e9), 4)}


@dataclass(frozen=True)
class _Prepared:
    """A config made ready to run: the settings that will really run and the weights they run on."""

    settings: TrialSettings
    notes: tuple[str, ...]
    model_facts: dict[str, Any]
    model_path: str | None
    unusable: str | None


def weight_type(ctx: TrialContext, settings: TrialSettings) -> str:
    """The GGUF weight type a llama.cpp config runs (the source file's own type for ``source``)."""
    return ctx.model.file_type if settings.quant == "source" else settings.quant.upper()


def _prepare(ctx: TrialContext, settings: TrialSettings) -> _Prepared:
    """Make the config's weights and check that its engine features run on this machine.

    Repacking (llama.cpp's extra buffer types) is turned off, with a note, for a weight type
    whose engine probe crashed (:mod:`tuner.backends.llama_cpp.health`); the trial records what really ran.
    """
    if infeasible_reason(settings, ctx.workload.needed_ctx()):  # known without weights: make none
        return _Prepared(settings, (), {"path": ctx.model.path, "quant": settings.quant,
                                        "size_bytes": ctx.model.size_bytes}, ctx.model.path, None)
    model_facts, model_path, unusable = _model_for(ctx, settings)
    notes: tuple[str, ...] = ()
    if ctx.health and model_path and not unusable:
        settings, notes = backends.get(settings.backend).engine_check(
            settings, weight_type(ctx, settings), model_path, ctx.health, ctx.progress.status)
    return _Prepared(settings, notes, model_facts, model_path, unusable)


ADAPTIVE_CV = 0.03  # an adaptive trial stops once its request times agree within this CV


def adaptive_rule(repetitions: int) -> dict[str, float]:
    """Adaptive repetitions for a search trial asked for ``repetitions``: at least 2 (or that many, if
    fewer), stop once their CV is below 3%, go on while it is above, up to the number asked.

    Not beyond it: in ``benchmarks/regret.py`` a cap of twice the ask made the search slower to come
    within 3% of the optimum (the extra repetitions went mostly to configs that could not win); the
    precision a winner needs comes from the re-measurement of the top configs at the end of a run."""
    return {"min": min(2, repetitions), "max": repetitions, "cv": ADAPTIVE_CV}


def _pruning(ctx: TrialContext, trial: optuna.Trial) -> Callable[[dict[str, Any]], str | None] | None:
    """Report each repetition's figures to Optuna as intermediate values (step = repetitions done)
    and ask the study's pruner whether the trial can still win; None for a multi-objective study
    (Optuna prunes single-objective studies only)."""
    judge = objectives.get(ctx.objective)
    if judge.multi:
        return None

    def check(figures: dict[str, Any]) -> str | None:
        so_far = R.PartialFigures.of(figures)
        step = so_far.repetitions
        value = judge.values(so_far)[0]
        with ctx.storage.errors():
            trial.report(value, step)
            if trial.should_prune():
                return (f"pruned after {step} repetition(s): {judge.name} {value:.4g} was worse than the median "
                        "of the other trials at that step (Optuna's median rule): it is not measured further")
        return None

    return check


def _execute(ctx: TrialContext, trial: optuna.Trial, prepared: _Prepared, role: str,
             repetitions: int | None, timeout_s: float | None,
             cut_at_deadline: bool, adaptive: bool = False) -> tuple[R.TrialOutcome, str, dict[str, Any]]:
    """Check quality and feasibility, then run the child: (outcome, violation, quality).

    The child runs at most ``timeout_s`` (the run's trial timeout by default) and, when
    ``cut_at_deadline``, never past the run's deadline: a child stopped there keeps the
    repetitions it finished (status ``cut``), or is ``interrupted`` if it finished none.
    An ``adaptive`` trial (the search's) runs as many repetitions as its spread needs
    (:func:`adaptive_rule`) and is stopped early when the pruner says it cannot win
    (status ``pruned``, keeping its figures).
    """
    timeout = min(timeout_s or ctx.timeout_s, ctx.timeout_s)
    settings, model_path = prepared.settings, prepared.model_path
    if prepared.unusable:
        return R.TrialOutcome(status=R.ERROR, reason=prepared.unusable), "", {}
    early = infeasible_reason(settings, ctx.workload.needed_ctx())
    if early:  # before the quality step: it would measure weights this config never runs
        return R.TrialOutcome(status=R.INFEASIBLE, reason=early), early, {}
    quality, violation = _quality(ctx, settings)
    pre = _precheck(ctx, settings, prepared.model_facts)
    if pre:
        return R.TrialOutcome(status=R.INFEASIBLE, reason=pre), pre, quality
    spec = {"model_path": model_path, "settings": settings.model_dump(),
            "workload": ctx.workload.model_dump(), "repetitions": repetitions or ctx.repetitions,
            "warmup": True, "fault": _fault_for(trial.number)}
    if adaptive:
        spec["adaptive"] = adaptive_rule(spec["repetitions"])

    def tick() -> None:
        ctx.storage.heartbeat(trial)

    tick()
    # Making weights can run long on first use; the child never runs past the run's deadline.
    left = ctx.deadline - time.monotonic() if ctx.deadline is not None and cut_at_deadline else timeout
    if left < 1:
        return R.TrialOutcome(status=R.INTERRUPTED, reason=DEADLINE_REASON), violation, quality
    ctx.progress.trial_started(trial.number, role, applicable(settings), 0.0)
    outcome = run_child(spec, timeout_s=min(timeout, left), memory_ceiling=ctx.memory_ceiling, tick=tick,
                        on_repetition=_pruning(ctx, trial) if adaptive else None)
    if outcome.status == R.TIMEOUT and left < timeout:
        done = len((outcome.result or {}).get("prefill_tps", []))
        outcome = replace(outcome, status=R.CUT, reason=f"{DEADLINE_REASON}; {done} of {spec['repetitions']} "
                          "repetitions kept") if done else replace(outcome, status=R.INTERRUPTED,
                                                                    reason=DEADLINE_REASON, result=None)
    elif outcome.status == R.TIMEOUT:
        outcome = replace(outcome, result=None)
    if outcome.status == R.OVER_CEILING:
        violation = outcome.reason
    return outcome, violation, quality


def run_trial(ctx: TrialContext, trial: optuna.Trial, settings: TrialSettings, role: str,
              repetitions: int | None = None, extra_notes: tuple[str, ...] = (), timeout_s: float | None = None,
              cut_at_deadline: bool = True, adaptive: bool = False) -> R.TrialRecord:
    """Measure ``settings`` as Optuna ``trial``, store the record and tell the study.

    ``adaptive``: repetitions follow the spread and the pruner may stop the trial early
    (see :func:`_execute`).

    A crash, hang or failure of the child is stored on a FAIL trial; a config over the
    memory ceiling or breaking a constraint is a COMPLETE trial with a violated constraint.
    The machine lock is held for the whole trial, quantization and perplexity included, since
    they load the CPU too. A KeyboardInterrupt stops the child, marks the trial interrupted
    and propagates.
    """
    settings, notes = normalize(settings)
    notes = [*extra_notes, *notes]
    key = config_key(settings)
    worker = {"host": platform.node(), "pid": os.getpid(), "started": time.time()}
    pending: dict[str, Any] = {"role": role, "settings": applicable(settings), "config_key": key,
                               "notes": notes, "worker": worker}
    with ctx.storage.errors():
        trial.set_user_attr(PENDING_ATTR, pending)
    try:
        with machine_lock(on_wait=lambda: ctx.progress.status("waiting: another trial runs on this machine")):
            prepared = _prepare(ctx, settings)
            pending["model"] = prepared.model_facts
            if prepared.settings != settings:
                settings, notes, key = prepared.settings, [*notes, *prepared.notes], config_key(prepared.settings)
                pending.update(settings=applicable(settings), config_key=key, notes=notes)
                with ctx.storage.errors():
                    trial.set_user_attr(PENDING_ATTR, pending)
            outcome, violation, quality = _execute(ctx, trial, prepared, role, repetitions, timeout_s,
                                                   cut_at_deadline, adaptive)
    except BaseException as exc:
        from ..results.studies import mark_failed

        status = R.INTERRUPTED if isinstance(exc, KeyboardInterrupt) else R.ERROR
        with contextlib.suppress(AutotuneError):  # the database itself may be what failed
            mark_failed(ctx.storage, ctx.storage.trial_id(trial), pending, status,
                        "autotune was interrupted" if status == R.INTERRUPTED else str(exc)[:500])
        raise
    model_facts = pending.get("model", {})
    result = outcome.result or {}
    disturbed = disturbance.summary(result.get(disturbance.KEY) or [])
    bandwidth = ctx.bandwidth_for(settings.n_threads) if ctx.bandwidth_for else None
    efficiency = decode_efficiency(ctx.model, bandwidth, settings, model_facts["size_bytes"], result)
    record = R.TrialRecord(
        role=role, settings=applicable(settings), config_key=key, notes=tuple(notes), outcome=outcome,
        prefill=R.Stat.of(result.get("prefill_tps", [])), decode=R.Stat.of(result.get("decode_tps", [])),
        ttft=R.Stat.of(result.get("ttft_s", [])), request=R.Stat.of(result.get("request_s", [])),
        decode_depth=R.Stat.of(result.get("decode_depth_tps", [])),
        load_s=result.get("load_s"), model=model_facts,
        worker=worker, violation=violation,
        extra={**quality, **({"chat": result["chat"]} if "chat" in result else {}),
               **({"timed_s": result["timed_s"]} if "timed_s" in result else {}), **efficiency,
               **({disturbance.KEY: disturbed} if disturbed["repetitions"] else {}),
               **{k: result[k] for k in ("depth", "depth_n_past", "depth_decode_tokens", "depth_note") if result.get(k)}})
    _tell(ctx, trial, record)
    return record


def _tell(ctx: TrialContext, trial: optuna.Trial, record: R.TrialRecord) -> None:
    data = json.loads(json.dumps(record.public()))
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


def check_ceiling(model: ModelInfo, memory_ceiling: int) -> None:
    """Refuse a memory ceiling that cannot hold even the model file."""
    if memory_ceiling < model.size_bytes + MEMORY_OVERHEAD:
        from ..util.units import format_bytes

        raise AutotuneError(f"the memory ceiling {format_bytes(memory_ceiling)} is smaller than the model "
                            f"{model.path} ({format_bytes(model.size_bytes)}) plus runtime overhead: "
                            "raise --memory-ceiling")
