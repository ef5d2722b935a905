"""llama.cpp's depth probe: the KV cache cut back or filled to the depth once per trial, its snapshot
restored before each repetition's decode at depth (:mod:`tuner.backends.depth` has the shared parts)."""

from __future__ import annotations

from typing import Any

from ...config.depth import depth_decode_tokens, resolve_depth
from ...config.workloads import prompt_tokens


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


def llama_probe(llm: Any, workload: Any, end: int, decode: Any) -> LlamaDepth:
    """The depth probe of a llama.cpp trial whose workload ends at ``end`` tokens."""
    n_decode = depth_decode_tokens(workload.generate_tokens)
    depth, note = resolve_depth(workload.depth, llm.n_ctx(), end, n_decode)
    fill = prompt_tokens(lambda t: llm.tokenize(t.encode(), add_bos=False), depth)
    probe = LlamaDepth(llm, depth, n_decode, fill, decode)
    probe.note = note
    return probe
