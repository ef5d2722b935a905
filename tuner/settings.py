"""One typed model for every setting autotune can tune, with bounds and descriptions.

The same model checks search-space files, normalizes sampled configs to what llama.cpp
will really run, and turns a config into ``llama_cpp.Llama`` keyword arguments or
``llama-server`` flags.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import AutotuneError

BACKENDS = ("llama_cpp", "transformers")

# ggml type ids of the KV cache types llama.cpp accepts for type_k / type_v.
KV_CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
                  "iq4_nl": 20, "bf16": 30}
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
                 "q4_1": 20 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32}

KvType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]


def _field(default: Any, backend: str | None, description: str, **bounds: Any) -> Any:
    extra = {"backend": backend} if backend else {}
    return Field(default, description=description, json_schema_extra=extra, **bounds)


class TrialSettings(BaseModel):
    """A complete inference configuration: what one trial measures."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["llama_cpp", "transformers"] = _field(
        "llama_cpp", None, "Inference engine: llama.cpp (GGUF) or transformers on torch.")
    # llama.cpp
    quant: str = _field("source", "llama_cpp",
                        "GGUF weight type: 'source' for the given file, or a llama.cpp type "
                        "such as Q4_0 or Q8_0 made from it.")
    n_threads: int = _field(1, "llama_cpp", "Threads for generation (decode).", ge=1, le=1024)
    n_threads_batch: int = _field(1, "llama_cpp", "Threads for prompt processing (prefill).",
                                  ge=1, le=1024)
    n_batch: int = _field(512, "llama_cpp", "Logical batch size: prompt tokens per decode call.",
                          ge=1, le=65536)
    n_ubatch: int = _field(512, "llama_cpp", "Physical batch size (micro-batch).", ge=1, le=65536)
    n_ctx: int = _field(2048, "llama_cpp", "Context size in tokens (KV cache length).",
                        ge=16, le=1_048_576)
    flash_attn: bool = _field(False, "llama_cpp", "Use flash attention.")
    type_k: KvType = _field("f16", "llama_cpp", "KV cache type for keys.")
    type_v: KvType = _field("f16", "llama_cpp",
                            "KV cache type for values (quantized needs flash attention).")
    use_mmap: bool = _field(True, "llama_cpp", "Memory-map the model file instead of reading it.")
    repack: bool = _field(True, "llama_cpp",
                          "Let llama.cpp repack weights into CPU-specific layouts (extra buffer types: "
                          "AMX, interleaved Q4_0); llama-server -nr turns it off.")
    n_gpu_layers: int = _field(0, "llama_cpp", "Layers offloaded to a GPU (-1 for all).",
                               ge=-1, le=10_000)
    # transformers
    torch_threads: int = _field(1, "transformers", "torch intra-op threads.", ge=1, le=1024)
    dtype: Literal["float32", "bfloat16", "float16"] = _field(
        "float32", "transformers", "Weight and activation dtype.")
    use_cache: bool = _field(True, "transformers", "Keep the KV cache between decode steps.")
    attn_implementation: Literal["eager", "sdpa"] = _field(
        "sdpa", "transformers", "Attention kernel.")
    cache_implementation: Literal["dynamic", "static"] = _field(
        "dynamic", "transformers", "KV cache layout.")


def param_backend(name: str) -> str | None:
    """The backend a parameter belongs to, or None for a parameter of every backend."""
    field = TrialSettings.model_fields.get(name)
    if field is None:
        raise KeyError(name)
    extra = field.json_schema_extra or {}
    return extra.get("backend")  # type: ignore[union-attr]


def params_for_backend(backend: str) -> list[str]:
    """The setting names that apply to ``backend`` (in model order)."""
    return [n for n in TrialSettings.model_fields if param_backend(n) in (None, backend)]


def applicable(settings: TrialSettings) -> dict[str, Any]:
    """Only the settings that mean something for the config's backend."""
    full = settings.model_dump()
    return {k: full[k] for k in params_for_backend(settings.backend)}


def normalize(settings: TrialSettings) -> tuple[TrialSettings, list[str]]:
    """What llama.cpp will really run, and a note for every value it changes.

    llama-cpp-python clamps ``n_batch`` to ``n_ctx`` and ``n_ubatch`` to ``n_batch`` without
    saying so; autotune applies the same rules first so the stored trial says what ran.
    """
    if settings.backend != "llama_cpp":
        return settings, []
    notes: list[str] = []
    changes: dict[str, Any] = {}
    n_batch = settings.n_batch
    if n_batch > settings.n_ctx:
        notes.append(f"n_batch {n_batch} clamped to n_ctx {settings.n_ctx}")
        n_batch = settings.n_ctx
        changes["n_batch"] = n_batch
    if settings.n_ubatch > n_batch:
        notes.append(f"n_ubatch {settings.n_ubatch} clamped to n_batch {n_batch}")
        changes["n_ubatch"] = n_batch
    return settings.model_copy(update=changes), notes


def infeasible_reason(settings: TrialSettings, needed_ctx: int) -> str | None:
    """Why llama.cpp cannot run ``settings`` for a workload needing ``needed_ctx`` tokens."""
    if settings.backend != "llama_cpp":
        return None
    if settings.type_v not in ("f16", "f32", "bf16") and not settings.flash_attn:
        return f"a quantized V cache ({settings.type_v}) needs flash attention"
    if settings.n_ctx < needed_ctx:
        return f"n_ctx {settings.n_ctx} is smaller than the workload's {needed_ctx} tokens"
    return None


def config_key(settings: TrialSettings) -> str:
    """A stable text key of the applicable settings: equal keys run the same real config."""
    items = sorted(applicable(settings).items())
    return ";".join(f"{k}={v}" for k, v in items)


def llama_kwargs(settings: TrialSettings, model_path: str) -> dict[str, Any]:
    """Keyword arguments for ``llama_cpp.Llama(**kwargs)`` that reproduce ``settings``."""
    if settings.backend != "llama_cpp":
        raise AutotuneError(f"a {settings.backend} config has no llama_cpp.Llama arguments")
    return {
        "model_path": model_path,
        "n_ctx": settings.n_ctx,
        "n_batch": settings.n_batch,
        "n_ubatch": settings.n_ubatch,
        "n_threads": settings.n_threads,
        "n_threads_batch": settings.n_threads_batch,
        "flash_attn": settings.flash_attn,
        "type_k": KV_CACHE_TYPES[settings.type_k],
        "type_v": KV_CACHE_TYPES[settings.type_v],
        "use_mmap": settings.use_mmap,
        "n_gpu_layers": settings.n_gpu_layers,
    }


def model_params(settings: TrialSettings) -> dict[str, Any]:
    """llama.cpp model parameters that ``Llama(...)`` has no keyword for (see :mod:`tuner.engine`)."""
    if settings.backend != "llama_cpp":
        raise AutotuneError(f"a {settings.backend} config has no llama.cpp model parameters")
    return {"use_extra_bufts": settings.repack}


def server_flags(settings: TrialSettings, model_path: str) -> list[str]:
    """``llama-server`` / ``llama-cli`` command-line flags that reproduce ``settings``."""
    if settings.backend != "llama_cpp":
        raise AutotuneError(f"a {settings.backend} config has no llama.cpp command line")
    flags = ["-m", model_path, "-c", str(settings.n_ctx), "-b", str(settings.n_batch),
             "-ub", str(settings.n_ubatch), "-t", str(settings.n_threads),
             "-tb", str(settings.n_threads_batch), "-fa", "on" if settings.flash_attn else "off",
             "-ctk", settings.type_k, "-ctv", settings.type_v, "-ngl", str(settings.n_gpu_layers)]
    if not settings.use_mmap:
        flags.append("--no-mmap")
    if not settings.repack:
        flags.append("--no-repack")
    return flags


def llama_cpp_defaults(logical_cpus: int, needed_ctx: int) -> TrialSettings:
    """What ``llama_cpp.Llama(model_path)`` runs when a user passes nothing.

    llama-cpp-python's default n_ctx (512) may be too small for the workload; the baseline
    then takes the smallest multiple of 256 that fits it, and says so in the trial.
    """
    n_ctx = 512 if needed_ctx <= 512 else -(-needed_ctx // 256) * 256
    return TrialSettings(backend="llama_cpp", quant="source",
                         n_threads=max(logical_cpus // 2, 1), n_threads_batch=logical_cpus,
                         n_batch=512, n_ubatch=512, n_ctx=n_ctx, flash_attn=False,
                         type_k="f16", type_v="f16", use_mmap=True, repack=True)


def transformers_defaults(logical_cpus: int) -> TrialSettings:
    """What ``AutoModelForCausalLM.from_pretrained`` + ``generate`` run by default on CPU."""
    return TrialSettings(backend="transformers", torch_threads=logical_cpus, dtype="float32",
                         use_cache=True, attn_implementation="sdpa",
                         cache_implementation="dynamic")
