"""llama.cpp's capabilities around a trial (:class:`tuner.backends.capabilities.Capabilities`): GGUF weight
variants made from the source, their quality (perplexity, KL divergence), the repacking verdicts of this
machine's engine, the llama.cpp export formats, a tuned ``Llama`` loaded or served."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...errors import AutotuneError
from ..capabilities import Capabilities, Health, QualityLimits, Say, ServerBinary, Verdicts, WeightFile
from . import engine, export_formats as formats, health as engine_health, kl, quality, quant, sizes, variants as found
from .engine import REPACK_CRASH_FAULT
from .kwargs import llama_kwargs, server_flags
from .server import llama_server_app
from .server_binary import find_llama_server
from .server_process import serving_flags
from ...config.model import ModelInfo
from ..settings_model import TrialSettings


PREPARATION_PASSES = 3  # evaluations of the quality text a new weight type costs: its perplexity, and the KL
                        # divergence's passes over the source and it


class GgufCapabilities(Capabilities):
    """What llama.cpp does around a trial; mixed into :class:`tuner.backends.llama_cpp.backend.LlamaCpp`."""

    weight_variants = True
    export_formats = formats.FORMATS
    own_server = True
    child_faults = (REPACK_CRASH_FAULT,)

    def find_variants(self, model_dir: str, model: ModelInfo) -> dict[str, Any]:
        """The GGUF variants of ``model`` in ``model_dir`` (:func:`tuner.backends.llama_cpp.variants.find_variants`)."""
        return found.find_variants(model_dir, model)

    def check_weight_name(self, name: str) -> str:
        """A llama.cpp quantization type name (:func:`tuner.backends.llama_cpp.quant.check_quant_name`)."""
        return quant.check_quant_name(name)

    def _variant(self, model: ModelInfo, name: str, variants: Mapping[str, Any], say: Say | None = None) -> Any:
        return variants.get(quant.check_quant_name(name)) or quant.ensure_variant(model, name, on_status=say)

    def weight_file(self, model: ModelInfo, settings: TrialSettings, variants: Mapping[str, Any],
                    say: Say) -> WeightFile:
        """The source GGUF, or its variant of type ``settings.quant`` (made once and cached)."""
        if settings.quant == "source":
            return super().weight_file(model, settings, variants, say)
        variant = self._variant(model, settings.quant, variants, say)
        facts = {"path": variant.path, "quant": variant.quant, "file_type": variant.quant,
                 "size_bytes": variant.size_bytes, "requantized": variant.requantized,
                 "source_file_type": variant.source_file_type, "created_s": variant.created_s}
        if variant.error:
            return WeightFile(facts, None, f"quantization to {settings.quant} failed: {variant.error}")
        return WeightFile(facts, variant.path)

    def smallest_weights(self, model: ModelInfo, quants: list[Any], variants: Mapping[str, Any]) -> int:
        """The file scaled by the smallest weight type among ``quants`` (llama.cpp's type sizes; a type of
        unknown size counts as the smallest there is), or a ready-made variant."""
        own = sizes.relative_size(model.file_type)
        least = min(sizes.LLAMA3_8B_GB.values()) / max(sizes.LLAMA3_8B_GB.values())
        ratios = [1.0] + [sizes.relative_size(q) / own if own and sizes.relative_size(q) else least
                          for q in quants if str(q) != "source"]
        return min([int(model.size_bytes * min(ratios)), *(v.size_bytes for v in variants.values())])

    def quality(self, model: ModelInfo, settings: TrialSettings, variants: Mapping[str, Any],
                limits: QualityLimits, say: Say) -> Verdicts:
        """Perplexity against the source's, then KL divergence and top-token agreement (issue 29); each
        measured once per weight file, then cached."""
        variant = self._variant(model, settings.quant, variants)
        if not quality.is_measured(variant, model, max_tokens=limits.tokens):  # said only when it takes time
            say(f"perplexity of {settings.quant} on the evaluation text")
        measured = quality.measure_quality(variant, model, max_tokens=limits.tokens)
        facts = {"perplexity": measured.perplexity, "reference_perplexity": measured.reference_perplexity,
                 "quality_loss": measured.loss}
        if measured.error:
            return Verdicts(facts, f"quality of {settings.quant} could not be measured: {measured.error}")
        divergence = self._divergence(model, settings, variant, facts, limits, say)
        if limits.max_quality_loss is not None and not quality.quality_ok(measured, limits.max_quality_loss):
            return Verdicts(divergence.facts, f"quality loss {measured.loss:+.1%} of {settings.quant} exceeds the "
                                              f"allowed {limits.max_quality_loss:.1%}")
        return divergence

    def _divergence(self, model: ModelInfo, settings: TrialSettings, variant: Any, facts: dict[str, Any],
                    limits: QualityLimits, say: Say) -> Verdicts:
        if not kl.is_measured(variant, model, max_tokens=limits.tokens):
            say(f"KL divergence of {settings.quant} against the source")
        divergence = kl.measure_divergence(variant, model, max_tokens=limits.tokens)
        facts = {**facts, **divergence.facts()}
        if limits.max_kl is not None and divergence.error:
            return Verdicts(facts, f"KL divergence of {settings.quant} could not be measured: {divergence.error}")
        if not kl.kl_ok(divergence, limits.max_kl):
            return Verdicts(facts, f"KL divergence {divergence.kl_mean:.4f} of {settings.quant} exceeds the allowed "
                                   f"{limits.max_kl:g} nats per token (--max-kl)")
        return Verdicts(facts)

    def preparation_passes(self, weight_type: str) -> int:
        """A new weight type's perplexity and the KL divergence's two passes; none for the source file."""
        return 0 if weight_type == "source" else PREPARATION_PASSES

    def system_info(self) -> str:
        """llama.cpp's build and CPU features line."""
        return engine.system_info()

    def open_health(self, extra: Mapping[str, Any], profile: Mapping[str, Any]) -> Health | None:
        """The repacking verdicts stored for this llama-cpp-python version and llama.cpp build."""
        key = engine_health.engine_key(profile["llama_cpp_python"], profile["llama_cpp_system_info"])
        return engine_health.EngineHealth.from_extra(dict(extra), key)

    def probe_health(self, health: Health, model: ModelInfo) -> None:
        """Probe repacking on ``model``'s weight type when nothing is known yet."""
        assert isinstance(health, engine_health.EngineHealth)
        if not health.verdicts:
            health.repack_verdict(model.file_type, model.path)

    def health_lines(self, extra: Mapping[str, Any]) -> list[str]:
        """One line per repacking verdict."""
        return engine_health.summary_lines(extra.get(engine_health.ENGINE_EXTRA))

    def health_sections(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        """``engine``: the weight types repacking crashes on, with the evidence, when any was probed."""
        engine = extra.get(engine_health.ENGINE_EXTRA)
        if not engine or not engine.get("repack"):
            return {}
        return {"engine": {"repack_unusable": engine.get("repack_unusable", []),
                           "evidence": engine_health.summary_lines(engine), "key": engine.get("key")}}

    def runnable_here(self, settings: TrialSettings, model_path: str, source: Callable[[], ModelInfo],
                      measured_here: bool) -> tuple[TrialSettings, str]:
        """The variant file the config names (made if this machine lacks it) and, for settings not measured
        here, repacking probed on this machine."""
        if not Path(model_path).is_file():
            raise AutotuneError(f"llama.cpp runs a GGUF file and {model_path} is not one: pass the model's GGUF "
                                "file as the model, or load the folder with backend='transformers'")
        if settings.quant != "source" and model_path == source().path:  # a variant this machine lacks
            variant = quant.ensure_variant(source(), settings.quant)
            if variant.error:
                raise AutotuneError(f"the {settings.quant} weights of the tuned config cannot be made here: "
                                    f"{variant.error}")
            model_path = variant.path
        if not measured_here and settings.repack:  # not probed on this machine yet: probe now
            weight = source().file_type if settings.quant == "source" else settings.quant
            if not engine_health.probe_repack(model_path, weight).usable:
                settings = settings.model_copy(update={"repack": False})
        return settings, str(model_path)

    def render_export(self, doc: dict[str, Any], fmt: str) -> str:
        """``llama-server`` flags, a ``llama_cpp.server`` config, or an Ollama Modelfile."""
        return formats.render(doc, fmt)

    def export_caveats(self, doc: dict[str, Any], fmt: str) -> list[str]:
        """Repacking off, where the format cannot say so."""
        return formats.caveats(doc, fmt)

    def load_tuned(self, settings: TrialSettings, model_path: str, **overrides: Any) -> Any:
        """A ready ``llama_cpp.Llama`` (``overrides``: ``Llama`` keywords)."""
        return engine.open_llama({**llama_kwargs(settings, model_path), **overrides}, repack=settings.repack)

    def from_document(self, doc: dict[str, Any], path: str, repack: bool | None, **overrides: Any) -> Any:
        """A ``Llama`` from the document's ``llama_cpp_kwargs``, repacking as its model parameters say."""
        kwargs = {**doc["llama_cpp_kwargs"], "verbose": False, **overrides}
        if not Path(kwargs["model_path"]).is_file():
            raise AutotuneError(f"the model {kwargs['model_path']} named in {path} is gone: "
                                "run `autotune run` again or pass model_path=...")
        if repack is None:
            repack = bool((doc.get("llama_cpp_model_params") or {}).get("use_extra_bufts", True))
        return engine.open_llama(kwargs, repack=repack)

    def server_command(self, settings: TrialSettings, model_path: str) -> list[str]:
        """``llama-server`` flags."""
        return server_flags(settings, model_path)

    def server_app(self, settings: TrialSettings, model_path: str, host: str, port: int) -> tuple[Any, Any]:
        """llama-cpp-python's server app (:func:`tuner.backends.llama_cpp.server.llama_server_app`)."""
        return llama_server_app(settings, model_path, host, port)

    def server_binary(self, say: Say, build: bool = True) -> ServerBinary | None:
        """llama.cpp's ``llama-server``, built once per llama-cpp-python version
        (:func:`tuner.backends.llama_cpp.server_binary.find_llama_server`)."""
        return find_llama_server(say, build)

    def serving_command(self, settings: TrialSettings, model_path: str) -> list[str]:
        """``llama-server`` and its flags, the slot count always given."""
        return ["llama-server", *serving_flags(settings, model_path)]
