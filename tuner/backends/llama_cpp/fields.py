"""The settings llama.cpp adds to the settings model (read by :mod:`tuner.backends.settings_model` without
loading the backend)."""

from __future__ import annotations

from typing import Any, Literal

from ..fields import setting

NAME = "llama_cpp"
LABEL = "llama.cpp"
KvType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]

# Settings left out of a config's applicable settings (and so of its key, tables and files) at their defaults:
# only a server has slots, and every config measured before they existed ran one sequence.
OMITTED_AT_DEFAULT = ("n_parallel", "kv_unified")

FIELDS: dict[str, tuple[Any, dict[str, Any]]] = {
    "quant": (str, setting("source", "GGUF weight type: 'source' for the given file, or a llama.cpp "
                                     "type such as Q4_0 or Q8_0 made from it.")),
    "n_threads": (int, setting(1, "Threads for generation (decode).", ge=1, le=1024)),
    "n_threads_batch": (int, setting(1, "Threads for prompt processing (prefill).", ge=1, le=1024)),
    "n_batch": (int, setting(512, "Logical batch size: prompt tokens per decode call.", ge=1, le=65536)),
    "n_ubatch": (int, setting(512, "Physical batch size (micro-batch).", ge=1, le=65536)),
    "n_ctx": (int, setting(2048, "Context size in tokens (KV cache length).", ge=16, le=1_048_576)),
    "flash_attn": (bool, setting(False, "Use flash attention.")),
    "type_k": (KvType, setting("f16", "KV cache type for keys.")),
    "type_v": (KvType, setting("f16", "KV cache type for values (quantized needs flash attention).")),
    "use_mmap": (bool, setting(True, "Memory-map the model file instead of reading it.")),
    "repack": (bool, setting(True, "Let llama.cpp repack weights into CPU-specific layouts (extra buffer "
                                   "types: AMX, interleaved Q4_0); llama-server -nr turns it off.")),
    "n_gpu_layers": (int, setting(0, "Layers offloaded to a GPU (-1 for all).", ge=-1, le=10_000)),
    # Serving several users (llama-server; the serve workload): slots decoded together in one batch.
    "n_parallel": (int, setting(1, "llama-server slots (-np): requests decoded at once; n_ctx is split "
                                   "among them unless kv_unified.", ge=1, le=256)),
    "kv_unified": (bool, setting(False, "llama-server --kv-unified: the slots share one KV cache of n_ctx "
                                        "tokens instead of n_ctx/n_parallel each.")),
}
