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
from ..backends.capabilities import Health, QualityLimits
from ..errors import AutotuneError
from ..selection.candidates import Candidate
from .state import MEMORY_OVERHEAD, QUALITY_TOKENS, TrialContext
from ..util.units import format_bytes


def _model_for(model: ModelInfo, settings: TrialSettings, variants: dict[str, Any],
               say: Callable[[str], None]) -> tuple[dict[str, Any], str | None, str | None]:
    """The model file a config runs on: (model facts, path, why unusable / quality violation)."""
    found = backends.get(settings.backend).weight_file(model, settings, variants, say)
    return found.facts, found.path, found.unusable


def quality_facts(ctx: TrialContext, settings: TrialSettings) -> tuple[dict[str, Any], str]:
    """Quality figures of the config's weights and a violation if the loss is too large.

    Measured (once per weight file, then cached) only when the run guards quality, i.e. the
    space searches weight types and ``max_quality_loss`` or ``max_kl`` is set: perplexity, and the
    KL divergence and top-token agreement against the source (the backend's :meth:`quality`).
    """
    limits = QualityLimits(ctx.max_quality_loss, ctx.max_kl, QUALITY_TOKENS)
    backend = backends.get(settings.backend)
    if not ctx.quality_guard or not limits.guarded or not backend.weight_variants:
        return {}, ""
    verdicts = backend.quality(ctx.model_for(settings.backend), settings, ctx.variants, limits, ctx.progress.status)
    return verdicts.facts, verdicts.violation


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
    """The weight type a config of the run runs (:func:`weight_type_of`)."""
    return weight_type_of(ctx.model_for(settings.backend), settings)


def weight_type_of(model: ModelInfo, settings: TrialSettings) -> str:
    """The weight type a config runs (the source file's own type for ``source``)."""
    return backends.get(settings.backend).weight_type(model, settings)


def prepare(ctx: TrialContext, settings: TrialSettings) -> Prepared:
    """Make the config's weights and check that its engine features run on this machine
    (:func:`prepare_weights` with the run's model, ready-made variants and engine verdicts)."""
    if infeasible_reason(settings, ctx.workload.needed_ctx()):  # known without weights: make none
        model = ctx.model_for(settings.backend)
        return Prepared(settings, (), {"path": model.path, "quant": settings.quant,
                                        "size_bytes": model.size_bytes}, model.path, None)
    return prepare_weights(ctx.model_for(settings.backend), settings, ctx.health, ctx.variants, ctx.progress.status)


def prepare_weights(model: ModelInfo, settings: TrialSettings, health: Health | None,
                    variants: dict[str, Any] | None = None, say: Callable[[str], None] = lambda _text: None) -> Prepared:
    """The weights ``settings`` run on (a quant variant of ``model``, made once and cached) and the settings
    that really run there: repacking (llama.cpp's extra buffer types) is turned off, with a note, for a
    weight type whose engine probe crashed (the backend's ``engine_check``). What every trial does
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
        raise AutotuneError(f"the memory ceiling {format_bytes(memory_ceiling)} is smaller than the model "
                            f"{model.path} ({format_bytes(model.size_bytes)}) plus runtime overhead: "
                            "raise --memory-ceiling")


def smallest_weights(model: ModelInfo, quants: list[Any], variants: dict[str, Any] | None = None) -> int:
    """A floor under the bytes any config of ``model`` maps (every weight is read), as the backend that loads
    its format knows it: the smallest weight type among ``quants``, a ready-made variant, or a narrower dtype."""
    return backends.for_format(model.format).smallest_weights(model, quants, variants or {})


def check_memory_target(max_memory: int | None, floor: int, model: ModelInfo) -> None:
    """Refuse a ``--max-memory`` target below ``floor`` (:func:`smallest_weights`): no config could meet it,
    and the run would measure its whole budget for nothing."""
    if max_memory is None or max_memory >= floor:
        return

    raise AutotuneError(f"the memory target {format_bytes(max_memory)} (--max-memory) is below anything {model.path} "
                        f"can run in: its smallest weights alone take about {format_bytes(floor)}; raise --max-memory")


def preparation_s(ctx: TrialContext, quant: str, cands: list[Candidate]) -> float:
    """Seconds a trial of the llama.cpp weight type ``quant`` may spend on its weights before its child runs:
    where the run guards quality and no trial of the study ran ``quant`` yet, the backend's
    ``preparation_passes`` of ``QUALITY_TOKENS`` tokens at the fastest prefill the study's llama.cpp configs measured
    (a cache may hold them: then the trial costs that much less than planned); else 0. On a 2-vCPU EPYC of
    family 23 a new weight type's perplexity and KL took ~35 s, twice a trial, and took the confirmation
    stage's time."""
    if not ctx.quality_guard or (ctx.max_quality_loss is None and ctx.max_kl is None) or quant == "source":
        return 0.0
    makers = [name for name, b in backends.REGISTRY.items() if b.weight_variants]
    passes = max((backends.get(name).preparation_passes(quant) for name in makers), default=0)
    made = [c for c in cands if c.backend in makers]
    if any(c.settings.get("quant") == quant for c in made):
        return 0.0
    prefill = max((c.prefill.median for c in made), default=0.0)
    return passes * QUALITY_TOKENS / prefill if prefill > 0 else 0.0
