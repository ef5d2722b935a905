"""The transformers backend: the same model on torch (CPU), weights dequantized to a float dtype.

A GGUF file is loaded through ``from_pretrained(..., gguf_file=...)``, which dequantizes every
tensor (once per file and dtype: later trials load its kept copy, :mod:`.loading`); a Hugging Face
model folder is loaded as it is. Generation is a hand-written greedy
loop rather than ``generate()`` so that prefill and decode are timed apart:

- prefill: one forward over the prompt from an empty cache; time to first token includes
  picking the first token (argmax of the last position's logits);
- decode: N steps of one token each on top of the cache (``use_cache=True``, a dynamic or a
  static cache), or, with ``use_cache=False``, a forward over the whole sequence every step:
  the work the KV cache saves.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from ..base import Backend
from ...config.depth import depth_decode_tokens, resolve_depth
from .depth import torch_probe
from .fields import FIELDS, LABEL, NAME
from .loading import kept, load
from .session import Session
from ..protocol import prefill_decode_reps
from ...config.workloads import prompt_tokens, Workload
from ..chat import CHATML, conversation_tokens, measure_chat
from ...config.model import ModelInfo
from ...measure.spec import TrialSpec

if TYPE_CHECKING:  # cycle break: the settings model loads this package first
    from ..settings_model import TrialSettings

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Resident memory of a trial's child beyond its weights (torch, transformers, tokenizer, buffers):
# measured ~0.69-0.73 GB with SmolLM2-135M; kept a little lower so the estimate stays a lower bound.
RUNTIME_BYTES = 600 * 1024**2


def estimate_memory_bytes(model_info: Any, dtype: str, context_tokens: int = 0) -> int:
    """A lower bound of the peak resident memory of a transformers trial, in bytes.

    The GGUF weights are dequantized: every parameter takes the dtype's full width (4 bytes for
    float32, 2 for bfloat16/float16) whatever the file's quant type; SmolLM2-135M's 98 MB Q4_1
    file becomes 538 MB of float32. ``context_tokens`` adds a KV cache of that length in the
    dtype. Measured peaks on SmolLM2-135M (tiny workload): 1.26 GB float32, 1.00 GB bfloat16;
    this gives 1.17 / 0.90 GB.
    """
    width = DTYPE_BYTES[dtype]
    kv = (model_info.n_layer * model_info.n_head_kv * (model_info.head_dim_k + model_info.head_dim_v)
          * width * context_tokens)
    return int(RUNTIME_BYTES + model_info.n_params * width + kv)


def transformers_defaults(logical_cpus: int) -> TrialSettings:
    """What ``AutoModelForCausalLM.from_pretrained`` + ``generate`` run by default on CPU."""
    from ..settings_model import TrialSettings  # cycle break: the settings model loads this package first

    return TrialSettings(backend="transformers", torch_threads=logical_cpus, dtype="float32",
                         use_cache=True, attn_implementation="sdpa", cache_implementation="dynamic")


class Transformers(Backend):
    """Hugging Face transformers on torch (CPU): a model folder's weights, or a GGUF's dequantized to a float dtype."""

    name = NAME
    label = LABEL
    summary_keys = ("torch_threads", "dtype", "use_cache")
    summary_prefix = "hf "
    thread_settings = {"prefill": "torch_threads", "decode": "torch_threads"}
    screened = ("use_cache", "dtype", "torch_threads", "attn_implementation", "cache_implementation")
    fields = FIELDS
    model_formats = ("gguf", "hf-folder")  # a GGUF dequantized, or a Hugging Face model folder as it is

    def load_tuned(self, settings: TrialSettings, model_path: str, **overrides: Any) -> Any:
        """A :class:`tuner.backends.transformers.loaded.TransformersModel` (``overrides``: ``max_tokens``)."""
        from . import loaded  # deferred: it needs the settings model, built while this package loads

        return loaded.load_transformers(model_path, settings, **overrides)

    def defaults(self, cpus: int, needed_ctx: int, serving: bool = False) -> TrialSettings:
        """transformers' own defaults on CPU: float32, sdpa attention, a dynamic cache, every CPU."""
        return transformers_defaults(cpus)

    def memory_needed(self, model: ModelInfo, settings: TrialSettings, weight_bytes: int) -> int:
        """Every parameter at the dtype's full width plus the runtime (:func:`estimate_memory_bytes`)."""
        return estimate_memory_bytes(model, settings.dtype)

    def informed_start(self, cpus: int, decode_threads: int) -> dict[str, Any]:
        """bfloat16 halves the weight reads of every token."""
        return {"torch_threads": cpus, "dtype": "bfloat16", "use_cache": True, "attn_implementation": "sdpa",
                "cache_implementation": "dynamic"}

    def describe(self, settings: dict[str, Any], model: dict[str, Any]) -> str:
        """"transformers bfloat16"."""
        return f"transformers {settings.get('dtype', '')}".strip()

    def measure(self, spec: TrialSpec) -> dict[str, Any]:
        """Load the model with the spec's settings and measure the spec's workload (in the child)."""
        return measure(spec)


def timed_feed(session: Session, tokens: list[int]) -> tuple[float, int]:
    """Seconds to process ``tokens`` and pick the next token, and that token."""
    start = time.perf_counter()
    token = session.feed(tokens)
    return time.perf_counter() - start, token


def timed_decode(session: Session, first: int, n_tokens: int) -> tuple[float, list[int]]:
    """Generate ``n_tokens`` greedily after ``first``; seconds taken and the tokens fed."""
    fed: list[int] = []
    token = first
    start = time.perf_counter()
    for _ in range(n_tokens):
        fed.append(token)
        token = session.feed([token])
    return time.perf_counter() - start, fed


def prompt_ids(tokenizer: Any, n_tokens: int) -> list[int]:
    """The single workload's prompt: the llama backend's construction, BOS first when there is one.

    llama.cpp's backend always puts BOS first; doing the same here makes both backends process
    the very same token ids.
    """
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return prompt_tokens(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
                         n_tokens, bos)


def measure_single(model: Any, tokenizer: Any, workload: Workload, repetitions: int, warmup: bool,
                   settings: TrialSettings) -> dict[str, Any]:
    """Prefill of P prompt tokens from an empty cache, then decode of N tokens, repeated."""
    tokens = prompt_ids(tokenizer, workload.prompt_tokens)
    end = len(tokens) + workload.generate_tokens
    max_ctx = getattr(model.config, "max_position_embeddings", None) or end
    room = max(end, resolve_depth(workload.depth, max_ctx, end, depth_decode_tokens(workload.generate_tokens))[0])
    session = Session(model, settings, room + workload.generate_tokens)
    depth = torch_probe(session, _tokenize(tokenizer), workload, end, max_ctx,
                        lambda first, n: timed_decode(session, first, n))
    return prefill_decode_reps(session.start, lambda toks: timed_feed(session, toks),
                               lambda first, n: timed_decode(session, first, n), tokens,
                               workload.generate_tokens, repetitions, warmup, depth, workload.rank_at_depth)


def _tokenize(tokenizer: Any) -> Any:
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


def measure(spec: TrialSpec) -> dict[str, Any]:
    """Load the model with the spec's settings and measure the spec's workload (in the child)."""
    # The GGUF dequantization bar is a plain tqdm that reads this when tqdm is first imported;
    # it would otherwise fill the stderr tail that a trial keeps.
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch

    from ..settings_model import TrialSettings  # cycle break: the settings model loads this package first

    settings = TrialSettings(**spec.settings)
    workload = spec.workload
    torch.set_num_threads(settings.torch_threads)
    made = not kept(spec.model_path, settings.dtype)
    start = time.perf_counter()
    model, tokenizer, load_s = load(spec.model_path, settings, keep=True)  # later trials load the dequantized copy
    once_s = time.perf_counter() - start if made and kept(spec.model_path, settings.dtype) else 0.0
    repetitions, warmup = spec.repetitions, spec.warmup
    with torch.inference_mode():
        if workload.kind == "chat":
            result = measure_chat_transformers(model, tokenizer, workload, repetitions, warmup, settings)
        else:
            result = measure_single(model, tokenizer, workload, repetitions, warmup, settings)
    result["load_s"] = load_s
    if once_s:  # dequantizing and keeping the copy: no later trial of this file pays it
        result["once_s"] = round(once_s, 3)
    result["dtype"] = str(model.dtype).removeprefix("torch.")
    result["attn_implementation"] = model.config._attn_implementation
    result["n_params"] = sum(p.numel() for p in model.parameters())
    return result


def measure_chat_transformers(model: Any, tokenizer: Any, workload: Workload, repetitions: int,
                              warmup: bool, settings: Any) -> dict[str, Any]:
    """The chat workload on a transformers model; run it under ``torch.inference_mode()``.

    With ``use_cache=False`` there is no cache to keep, so both modes recompute everything
    (a speedup near 1, and slow).
    """
    template = tokenizer.chat_template or CHATML
    turns = conversation_tokens(
        workload, template,
        lambda text, first: tokenizer(text, add_special_tokens=first)["input_ids"],
        tokenizer.bos_token or "", tokenizer.eos_token or "")
    total = sum(len(t) for t in turns) + workload.generate_tokens * len(turns)
    max_ctx = getattr(model.config, "max_position_embeddings", None) or total
    room = max(total, resolve_depth(workload.depth, max_ctx, total, depth_decode_tokens(workload.generate_tokens))[0])
    session = Session(model, settings, room + workload.generate_tokens)
    depth = torch_probe(session, _tokenize(tokenizer), workload, total, max_ctx,
                        lambda first, n: timed_decode(session, first, n))
    return measure_chat(session, turns, workload, repetitions, warmup, max_ctx, depth)
