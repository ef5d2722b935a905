"""A trial's preparation before its child runs: the weights it runs on (a quant variant, made once),
their quality against the source (perplexity, KL divergence) under the run's guard, the engine check
(repacking off where it crashes), and what can be known infeasible without running."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import backends
from ..backends.settings import TrialSettings, infeasible_reason
from ..config.model import ModelInfo
from ..backends.llama_cpp.health import EngineHealth
from ..errors import AutotuneError
from .context import MEMORY_OVERHEAD, QUALITY_TOKENS, TrialContext


def _model_for(model: ModelInfo, settings: TrialSettings, variants: dict[str, Any],
               say: Callable[[str], None]) -> tuple[dict[str, Any], str | None, str | None]:
    """The model file a config runs on: (model facts, path, why unusable / quality violation)."""
    if not backends.get(settings.backend).weight_variants or settings.quant == "source":
        return {"path": model.path, "quant": "source", "file_type": model.file_type,
                "size_bytes": model.size_bytes}, model.path, None
    from ..backends.llama_cpp.quant import check_quant_name, ensure_variant

    variant = variants.get(check_quant_name(settings.quant)) or ensure_variant(model, settings.quant, on_status=say)
    facts = {"path": variant.path, "quant": variant.quant, "file_type": variant.quant,
             "size_bytes": variant.size_bytes, "requantized": variant.requantized,
             "source_file_type": variant.source_file_type, "created_s": variant.created_s}
    if variant.error:
        return facts, None, f"quantization to {settings.quant} failed: {variant.error}"
    return facts, variant.path, None


def quality_facts(ctx: TrialContext, settings: TrialSettings) -> tuple[dict[str, Any], str]:
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

    variant = ctx.variants.get(check_quant_name(settings.quant)) or ensure_variant(ctx.model_for(settings.backend), settings.quant)
    if not is_measured(variant, ctx.model_for(settings.backend), max_tokens=QUALITY_TOKENS):  # said only when it takes time
        ctx.progress.status(f"perplexity of {settings.quant} on the evaluation text")
    quality = measure_quality(variant, ctx.model_for(settings.backend), max_tokens=QUALITY_TOKENS)
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

    if not is_measured(variant, ctx.model_for(settings.backend), max_tokens=QUALITY_TOKENS):
        ctx.progress.status(f"KL divergence of {settings.quant} against the source")
    divergence = measure_divergence(variant, ctx.model_for(settings.backend), max_tokens=QUALITY_TOKENS)
    facts = {**facts, **divergence.facts()}
    if ctx.max_kl is not None and divergence.error:
        return facts, f"KL divergence of {settings.quant} could not be measured: {divergence.error}"
    if not kl_ok(divergence, ctx.max_kl):
        return facts, (f"KL divergence {divergence.kl_mean:.4f} of {settings.quant} exceeds the allowed "
                       f"{ctx.max_kl:g} nats per token (--max-kl)")
    return facts, ""


def precheck(ctx: TrialContext, settings: TrialSettings, model_facts: dict[str, Any]) -> str:
    reason = infeasible_reason(settings, ctx.workload.needed_ctx())
    if reason:
        return reason
    need = backends.get(settings.backend).memory_needed(ctx.model_for(settings.backend), settings, model_facts["size_bytes"])
    if need + MEMORY_OVERHEAD > ctx.memory_ceiling:
        return (f"needs at least {need + MEMORY_OVERHEAD} bytes (weights + KV cache) but the memory "
                f"ceiling is {ctx.memory_ceiling}")
    return ""


@dataclass(frozen=True)
class Prepared:
    """A config made ready to run: the settings that will really run and the weights they run on."""

    settings: TrialSettings
    notes: tuple[str, ...]
    model_facts: dict[str, Any]
    model_path: str | None
    unusable: str | None


def weight_type(ctx: TrialContext, settings: TrialSettings) -> str:
    """The GGUF weight type a llama.cpp config of the run runs (:func:`weight_type_of`)."""
    return weight_type_of(ctx.model_for(settings.backend), settings)


def weight_type_of(model: ModelInfo, settings: TrialSettings) -> str:
    """The GGUF weight type a llama.cpp config runs (the source file's own type for ``source``)."""
    return model.file_type if settings.quant == "source" else settings.quant.upper()


def prepare(ctx: TrialContext, settings: TrialSettings) -> Prepared:
    """Make the config's weights and check that its engine features run on this machine
    (:func:`prepare_weights` with the run's model, ready-made variants and engine verdicts)."""
    if infeasible_reason(settings, ctx.workload.needed_ctx()):  # known without weights: make none
        model = ctx.model_for(settings.backend)
        return Prepared(settings, (), {"path": model.path, "quant": settings.quant,
                                        "size_bytes": model.size_bytes}, model.path, None)
    return prepare_weights(ctx.model_for(settings.backend), settings, ctx.health, ctx.variants, ctx.progress.status)


def prepare_weights(model: ModelInfo, settings: TrialSettings, health: EngineHealth | None,
                    variants: dict[str, Any] | None = None, say: Callable[[str], None] = lambda _text: None) -> Prepared:
    """The weights ``settings`` run on (a quant variant of ``model``, made once and cached) and the settings
    that really run there: repacking (llama.cpp's extra buffer types) is turned off, with a note, for a
    weight type whose engine probe crashed (:mod:`tuner.backends.llama_cpp.health`). What every trial does
    before its child starts, and what the benchmarks do before theirs."""
    model_facts, model_path, unusable = _model_for(model, settings, variants or {}, say)
    notes: tuple[str, ...] = ()
    if health and model_path and not unusable:
        settings, notes = backends.get(settings.backend).engine_check(settings, weight_type_of(model, settings),
                                                                      model_path, health, say)
    return Prepared(settings, notes, model_facts, model_path, unusable)


def check_ceiling(model: ModelInfo, memory_ceiling: int) -> None:
    """Refuse a memory ceiling that cannot hold even the model file."""
    if memory_ceiling < model.size_bytes + MEMORY_OVERHEAD:
        from ..util.units import format_bytes

        raise AutotuneError(f"the memory ceiling {format_bytes(memory_ceiling)} is smaller than the model "
                            f"{model.path} ({format_bytes(model.size_bytes)}) plus runtime overhead: "
                            "raise --memory-ceiling")


FOLDER_FLOOR = 0.25  # a model folder's weights may load in a narrower dtype: at least a quarter of its files


def smallest_weights(model: ModelInfo, quants: list[Any], variants: dict[str, Any] | None = None) -> int:
    """A floor under the bytes any config of ``model`` maps (every weight is read): its file, the smallest
    weight type among ``quants`` (scaled by llama.cpp's type sizes; a type of unknown size counts as the
    smallest there is), a ready-made variant, or a quarter of a model folder (a narrower dtype)."""
    from ..backends.llama_cpp.sizes import LLAMA3_8B_GB, relative_size

    if model.format != "gguf":
        return int(model.size_bytes * FOLDER_FLOOR)
    own = relative_size(model.file_type)
    least = min(LLAMA3_8B_GB.values()) / max(LLAMA3_8B_GB.values())
    ratios = [1.0] + [relative_size(q) / own if own and relative_size(q) else least
                      for q in quants if str(q) != "source"]
    sizes = [int(model.size_bytes * min(ratios)), *(v.size_bytes for v in (variants or {}).values())]
    return min(sizes)


def check_memory_target(max_memory: int | None, floor: int, model: ModelInfo) -> None:
    """Refuse a ``--max-memory`` target below ``floor`` (:func:`smallest_weights`): no config could meet it,
    and the run would measure its whole budget for nothing."""
    if max_memory is None or max_memory >= floor:
        return
    from ..util.units import format_bytes

    raise AutotuneError(f"the memory target {format_bytes(max_memory)} (--max-memory) is below anything {model.path} "
                        f"can run in: its smallest weights alone take about {format_bytes(floor)}; raise --max-memory")


PREPARATION_PASSES = 3  # evaluations of the quality text a new weight type costs: its perplexity, and the KL
                        # divergence's passes over the source and it


def preparation_s(ctx: TrialContext, quant: str, cands: list[Any]) -> float:
    """Seconds a trial of the llama.cpp weight type ``quant`` may spend on its weights before its child runs:
    where the run guards quality and no trial of the study ran ``quant`` yet, ``PREPARATION_PASSES``
    evaluations of ``QUALITY_TOKENS`` tokens at the fastest prefill the study's llama.cpp configs measured
    (a cache may hold them: then the trial costs that much less than planned); else 0. On a 2-vCPU EPYC of
    family 23 a new weight type's perplexity and KL took ~35 s, twice a trial, and took the confirmation
    stage's time."""
    if not ctx.quality_guard or (ctx.max_quality_loss is None and ctx.max_kl is None) or quant == "source":
        return 0.0
    llama = [c for c in cands if backends.get(c.backend).weight_variants]
    if any(c.settings.get("quant") == quant for c in llama):
        return 0.0
    prefill = max((c.prefill.median for c in llama), default=0.0)
    return PREPARATION_PASSES * QUALITY_TOKENS / prefill if prefill > 0 else 0.0
