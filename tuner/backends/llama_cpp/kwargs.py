"""How a llama.cpp config is handed to llama.cpp: ``Llama`` keywords, model parameters, server flags."""

from __future__ import annotations

from typing import Any
from ..settings_model import TrialSettings


# ggml type ids of the KV cache types llama.cpp accepts for type_k / type_v.
KV_CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
                  "iq4_nl": 20, "bf16": 30}
UNQUANTIZED_V = ("f16", "f32", "bf16")


def llama_kwargs(settings: TrialSettings, model_path: str) -> dict[str, Any]:
    """Keyword arguments for ``llama_cpp.Llama(**kwargs)`` that reproduce ``settings`` (all but repacking)."""
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
    """llama.cpp model parameters that ``Llama(...)`` has no keyword for (see :mod:`tuner.backends.llama_cpp.engine`)."""
    return {"use_extra_bufts": settings.repack}


def server_flags(settings: TrialSettings, model_path: str) -> list[str]:
    """``llama-server`` / ``llama-cli`` command-line flags that reproduce ``settings``."""
    flags = ["-m", model_path, "-c", str(settings.n_ctx), "-b", str(settings.n_batch),
             "-ub", str(settings.n_ubatch), "-t", str(settings.n_threads),
             "-tb", str(settings.n_threads_batch), "-fa", "on" if settings.flash_attn else "off",
             "-ctk", settings.type_k, "-ctv", settings.type_v, "-ngl", str(settings.n_gpu_layers)]
    if not settings.use_mmap:  # the pinned llama.cpp's llama-server has no --no-mmap: its load mode says it
        flags += ["-lm", "none"]
    if not settings.repack:
        flags.append("--no-repack")
    if settings.n_parallel > 1:
        flags += ["-np", str(settings.n_parallel)]
    if settings.kv_unified:
        flags.append("--kv-unified")
    return flags
