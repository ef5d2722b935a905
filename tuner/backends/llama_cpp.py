"""The llama.cpp backend (llama-cpp-python), measured with as little Python overhead as the API allows.

Prefill is one ``Llama.eval`` of the whole prompt from an empty cache; decode is N single-token
evals, each next token the argmax of the last logits (read straight from llama.cpp's buffer).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from . import prefill_decode_reps
from ..settings import TrialSettings, llama_kwargs
from ..workloads import Workload, prompt_tokens


def load(spec: dict[str, Any]) -> tuple[Any, float]:
    """A ``Llama`` built from the spec's settings, and its load time in seconds."""
    from ..engine import open_llama

    settings = TrialSettings(**spec["settings"])
    kwargs = llama_kwargs(settings, spec["model_path"])
    start = time.perf_counter()
    llm = open_llama(kwargs, repack=settings.repack)
    return llm, time.perf_counter() - start


def _next_token(llm: Any, n_vocab: int) -> int:
    logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
    return int(logits.argmax())


def prefill(llm: Any, tokens: list[int], n_vocab: int) -> tuple[float, int]:
    """Evaluate ``tokens`` on top of the cache; seconds to the first next token, and that token."""
    start = time.perf_counter()
    llm.eval(tokens)
    token = _next_token(llm, n_vocab)
    return time.perf_counter() - start, token


def decode(llm: Any, first: int, n_tokens: int, n_vocab: int) -> tuple[float, list[int]]:
    """Generate ``n_tokens`` greedily after ``first``; seconds taken and the tokens fed."""
    fed = []
    token = first
    start = time.perf_counter()
    for _ in range(n_tokens):
        llm.eval([token])
        fed.append(token)
        token = _next_token(llm, n_vocab)
    return time.perf_counter() - start, fed


def measure_single(llm: Any, workload: Workload, repetitions: int, warmup: bool) -> dict[str, Any]:
    """Prefill of P prompt tokens from an empty cache, then decode of N tokens, repeated."""
    n_vocab = llm.n_vocab()
    tokens = prompt_tokens(lambda t: llm.tokenize(t.encode(), add_bos=False),
                           workload.prompt_tokens, [llm.token_bos()])
    # llm.reset() empties the cache: llama-cpp-python would otherwise reuse the matching prefix.
    return prefill_decode_reps(llm.reset, lambda toks: prefill(llm, toks, n_vocab),
                               lambda first, n: decode(llm, first, n, n_vocab), tokens,
                               workload.generate_tokens, repetitions, warmup)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Load the model with the spec's settings and measure the spec's workload."""
    workload = Workload(**spec["workload"])
    llm, load_s = load(spec)
    if workload.kind == "chat":
        from .chat import measure_chat_llama

        result = measure_chat_llama(llm, workload, spec["repetitions"], spec.get("warmup", True))
    else:
        result = measure_single(llm, workload, spec["repetitions"], spec.get("warmup", True))
    result["load_s"] = load_s
    result["n_ctx"] = llm.n_ctx()
    result["n_batch"] = llm.n_batch
    return result
