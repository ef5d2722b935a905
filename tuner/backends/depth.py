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

from ..config.depth import DEPTH_DECODE_MAX, depth_decode_tokens, parse_depth, resolve_depth  # noqa: F401


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


def torch_probe(session: Any, tokenize: Any, workload: Any, end: int, max_ctx: int, decode: Any) -> TorchDepth:
    """The depth probe of a transformers trial (``max_ctx``: the model's context length)."""
    from ..config.workloads import prompt_tokens

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
