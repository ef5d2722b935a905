"""A model and its tokenizer loaded with transformers: a Hugging Face folder, or a GGUF file dequantized."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # cycle break: the settings model loads this package first
    from ..settings_model import TrialSettings


def load(model_path: str, settings: TrialSettings) -> tuple[Any, Any, float]:
    """Tokenizer and model for ``model_path`` (a GGUF file or a model folder), and the load seconds."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(model_path)
    start = time.perf_counter()
    if path.is_dir():
        where, tok_extra, model_extra = path, {}, {}
    else:
        # Dense weights in the asked dtype, said explicitly: for some architectures transformers
        # could otherwise keep the GGUF blocks packed (and warns about dtype even when it does not).
        where, tok_extra = path.parent, {"gguf_file": path.name}
        model_extra = {**tok_extra, "quantization_config": GgufConfig(dequantize=True)}
    tokenizer = AutoTokenizer.from_pretrained(where, **tok_extra)
    model = AutoModelForCausalLM.from_pretrained(
        where, dtype=getattr(torch, settings.dtype), attn_implementation=settings.attn_implementation,
        **model_extra)
    model.eval()
    return model, tokenizer, time.perf_counter() - start
