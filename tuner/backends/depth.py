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

What every backend shares is here (:func:`timed`); each backend's probe is in its own package
(``tuner/backends/<name>/depth.py``), the depth itself is resolved by :mod:`tuner.config.depth`.
"""

from __future__ import annotations

import time
from typing import Any


def timed(probe: Any) -> tuple[float, float]:
    """(decode tokens/s at depth, seconds the probe took in all, building included)."""
    start = time.perf_counter()
    seconds = probe.measure()
    return probe.n_decode / seconds, time.perf_counter() - start
