"""Decode at depth on a transformers session (issue 29): the cache cut back or filled to D once per trial,
kept as a copy and restored before each later repetition's decode at depth (:mod:`tuner.backends.depth`
has the shared parts, :mod:`tuner.config.depth` resolves D)."""

from __future__ import annotations

import copy
from typing import Any

from ...config.depth import depth_decode_tokens, resolve_depth
from ...config.workloads import prompt_tokens


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
    n_decode = depth_decode_tokens(workload.generate_tokens)
    depth, note = resolve_depth(workload.depth, max_ctx, end, n_decode)
    probe = TorchDepth(session, depth, n_decode, prompt_tokens(tokenize, depth), decode)
    probe.note = note
    return probe
