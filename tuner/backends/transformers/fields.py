"""The settings transformers adds to the settings model (read by :mod:`tuner.backends.settings_model`
without loading the backend)."""

from __future__ import annotations

from typing import Any, Literal

from ..fields import setting

NAME = "transformers"
LABEL = "transformers"

FIELDS: dict[str, tuple[Any, dict[str, Any]]] = {
    "torch_threads": (int, setting(1, "torch intra-op threads.", ge=1, le=1024)),
    "dtype": (Literal["float32", "bfloat16", "float16"], setting("float32", "Weight and activation dtype.")),
    "use_cache": (bool, setting(True, "Keep the KV cache between decode steps.")),
    "attn_implementation": (Literal["eager", "sdpa"], setting("sdpa", "Attention kernel.")),
    "cache_implementation": (Literal["dynamic", "static"], setting("dynamic", "KV cache layout.")),
}
