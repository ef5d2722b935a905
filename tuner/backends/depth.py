"""Decode at a filled context: the second decode figure every trial measures (issue 29).

A trial measures decode right after the workload's prompt (``decode_tps``) and again with the
KV cache filled to a depth D (``decode_depth_tps``). D is the workload's own depth (where it
ends: prompt plus generated tokens, or the whole conversation of a chat) unless ``--depth`` asks
for N tokens or a share of n_ctx (``75%``).

Reaching D costs little: the cache each repetition already holds (the prompt and the tokens just
decoded) is cut back to D, or filled on top with corpus tokens up to D, once per trial. That cache
is then kept as a snapshot of the sequence (``llama_state_seq_get_data``; a copy of the torch
cache) and restored before every later repetition's decode at depth, which is timed alone: each
repetition decodes ``depth_decode_tokens`` tokens with exactly D tokens in the cache (the engine's
own count is recorded as ``depth_n_past``).
"""

from __future__ import annotations

import copy
import time
from typing import Any

DEPTH_DECODE_MAX = 16  # tokens decoded at depth per repetition: ~7% of a default trial's timed time (32 took 13-16%)


def depth_decode_tokens(generate_tokens: int) -> int:
    """Tokens decoded at depth per repetition: the workload's answer length, at most 16."""
    return max(1, min(generate_tokens, DEPTH_DECODE_MAX))


def parse_depth(text: str | int | None) -> int | str | None:
    """``--depth`` as given: an int token count, a share of n_ctx ("75%"), or None; ValueError else."""
    if text is None or isinstance(text, int):
        if isinstance(text, int) and text < 1:
            raise ValueError("a depth must be at least 1 token")
        return text
    raw = str(text).strip()
    if raw.endswith("%"):
        share = float(raw[:-1])
        if not 0 < share <= 100:
            raise ValueError(f"a depth share must be in (0, 100]%, not {raw}")
        return f"{share:g}%"
    value = int(raw)
    if value < 1:
        raise ValueError("a depth must be at least 1 token")
    return value


def resolve_depth(depth: int | str | None, n_ctx: int, workload_end: int, n_decode: int) -> tuple[int, str]:
    """The depth in tokens for a trial with ``n_ctx``: (D, note). None means the workload's own end.

    D is capped so that the decode at depth still fits the context (the note says so).
    """
    if depth is None:
        want = workload_end
    elif isinstance(depth, str) and depth.endswith("%"):
        want = int(float(depth[:-1]) / 100 * n_ctx)
    else:
        want = int(depth)
    cap = max(1, n_ctx - n_decode)
    if want > cap:
        return cap, f"depth {want} capped to {cap}: n_ctx {n_ctx} must hold the {n_decode} tokens decoded there"
    return max(1, want), ""


class LlamaDepth:
    """Decode at depth on a ``llama_cpp.Llama`` (see the module docstring)."""

    def __init__(self, llm: Any, depth: int, n_decode: int, fill: list[int], decode: Any):
        self.llm, self.depth, self.n_decode, self.fill, self._decode = llm, depth, n_decode, fill, decode
        self.snapshot: bytes | None = None
        self.note = ""
        self.first = 0
        self.n_past: list[int] = []

    def _engine_n_past(self) -> int:
        import llama_cpp

        return int(llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(self.llm._ctx.ctx), 0)) + 1

    def _build(self) -> None:
        """Cut the cache back to D or fill it up to D, from whatever it holds now; snapshot it."""
        import llama_cpp

        llm, have = self.llm, self.llm.n_tokens
        if have > self.depth:  # the next token is the one that stood there
            llm._ctx.kv_cache_seq_rm(0, self.depth, -1)
            llm.n_tokens = self.depth
            self.first = int(llm.input_ids[self.depth])
        else:  # already there, or filled on top with corpus tokens: the argmax of the last logits
            import numpy as np

            if have < self.depth:
                llm.eval(self.fill[: self.depth - have])
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
            self.first = int(logits.argmax())
        ctx = llm._ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        buf = (llama_cpp.ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
        self.snapshot = bytes(buf[:n])
        self.ids = llm.input_ids[: self.depth].copy()

    def _restore(self) -> None:
        import llama_cpp

        llm = self.llm
        llm.reset()
        llm._ctx.kv_cache_clear()
        buf = (llama_cpp.ctypes.c_uint8 * len(self.snapshot)).from_buffer_copy(self.snapshot)
        if llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, buf, len(self.snapshot), 0) != len(self.snapshot):
            raise RuntimeError("restoring the KV cache snapshot at depth failed")
        llm.input_ids[: self.depth] = self.ids
        llm.n_tokens = self.depth

    def measure(self) -> float:
        """Seconds to decode ``n_decode`` tokens with D tokens in the cache (D checked in the engine)."""
        if self.snapshot is None:
            self._build()
        else:
            self._restore()
        self.n_past.append(self._engine_n_past())
        seconds, _ = self._decode(self.first, self.n_decode)
        return seconds


class TorchDepth:
    """Decode at depth on a transformers session (:class:`tuner.backends.transformers.Session`)."""

    def __init__(self, session: Any, depth: int, n_decode: int, fill: list[int], decode: Any):
        self.session, self.depth, self.n_decode, self.fill, self._decode = session, depth, n_decode, fill, decode
        self.snapshot: Any = None
        self.note = ""
        self.first = 0
        self.n_past: list[int] = []

    def _build(self) -> None:
        s = self.session
        have = list(s.history)
        crop = s.cache.crop if type(s.cache).__name__ == "DynamicCache" else None  # a static cache cannot
        if len(have) == self.depth:  # already there: the next token only seeds the greedy chain
            self.first = have[-1]
        elif len(have) > self.depth and crop is not None:  # transformers 5: crop(-n) drops the last n
            crop(self.depth - len(have))
            s.history = have[: self.depth]
            self.first = have[self.depth]
        elif len(have) < self.depth and s.cache is not None:
            self.first = s.feed(self.fill[: self.depth - len(have)])
        else:  # no cache to cut (static / none): run the depth's tokens once from empty
            tokens = (have + self.fill)[: self.depth]
            s.start()
            self.first = s.feed(tokens)
        self.snapshot = (copy.deepcopy(s.cache), list(s.history))

    def measure(self) -> float:
        """Seconds to decode ``n_decode`` tokens after D tokens."""
        if self.snapshot is None:
            self._build()
        else:
            cache, history = self.snapshot
            self.session.cache, self.session.history = copy.deepcopy(cache), list(history)
        self.n_past.append(len(self.session.history))
        seconds, _ = self._decode(self.first, self.n_decode)
        return seconds


def llama_probe(llm: Any, workload: Any, end: int, decode: Any) -> LlamaDepth:
    """The depth probe of a llama.cpp trial whose workload ends at ``end`` tokens."""
    from ..workloads import prompt_tokens

    n_decode = depth_decode_tokens(workload.generate_tokens)
    depth, note = resolve_depth(workload.depth, llm.n_ctx(), end, n_decode)
    fill = prompt_tokens(lambda t: llm.tokenize(t.encode(), add_bos=False), depth)
    probe = LlamaDepth(llm, depth, n_decode, fill, decode)
    probe.note = note
    return probe


def torch_probe(session: Any, tokenize: Any, workload: Any, end: int, max_ctx: int, decode: Any) -> TorchDepth:
    """The depth probe of a transformers trial (``max_ctx``: the model's context length)."""
    from ..workloads import prompt_tokens

    n_decode = depth_decode_tokens(workload.generate_tokens)
    depth, note = resolve_depth(workload.depth, max_ctx, end, n_decode)
    probe = TorchDepth(session, depth, n_decode, prompt_tokens(tokenize, depth), decode)
    probe.note = note
    return probe


def timed(probe: Any) -> tuple[float, float]:
    """(decode tokens/s at depth, seconds the probe took in all, building included)."""
    start = time.perf_counter()
    seconds = probe.measure()
    return probe.n_decode / seconds, time.perf_counter() - start
