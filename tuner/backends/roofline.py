"""Decode against the memory-bandwidth roofline, in one place: a decoded token reads every weight and the
KV cache at the context's mean depth, so ``decode tokens/s x bytes per token`` cannot exceed the bandwidth.

Each backend says how many bytes a token reads (:meth:`tuner.backends.base.Backend.decode_bytes_per_token`,
None where it is not modelled); the search records the share per trial, the summary and the roofline
benchmark show it, all through :func:`decode_roofline`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import get


@dataclass(frozen=True)
class Roofline:
    """A decode speed against the bandwidth limit."""

    bytes_per_token: float   # weights plus KV cache read per decoded token
    bandwidth_gbs: float     # what the decode's threads can draw
    efficiency: float        # decode tokens/s x bytes per token / bandwidth (1.0 = at the physical limit)

    def facts(self) -> dict[str, float]:
        """The figures a trial record keeps."""
        return {"decode_bytes_per_token": round(self.bytes_per_token), "decode_bandwidth_gbs": self.bandwidth_gbs,
                "decode_efficiency": round(self.efficiency, 4)}


def decode_roofline(backend: str | None, model: dict[str, Any], settings: dict[str, Any], weight_bytes: float,
                    prompt_tokens: float, generate_tokens: float, decode_tps: float | None,
                    bandwidth_gbs: float | None) -> Roofline | None:
    """``decode_tps`` of a config of ``backend`` against ``bandwidth_gbs``, the context at its mean depth
    (the prompt plus half the generated tokens); None without a decode figure, a bandwidth, or a model of
    the bytes a token reads for that backend."""
    if not decode_tps or not bandwidth_gbs:
        return None
    mean_ctx = prompt_tokens + generate_tokens / 2
    per_token = get(backend).decode_bytes_per_token(model, settings, weight_bytes, mean_ctx)
    if not per_token:
        return None
    return Roofline(per_token, bandwidth_gbs, decode_tps * per_token / (bandwidth_gbs * 1e9))
