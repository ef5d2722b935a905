"""Decode at depth, as a workload states it: how deep (``--depth N`` or a share of n_ctx), and how many
tokens are decoded there. The engines' probes that reach the depth live with each backend
(:mod:`tuner.backends.depth`, :mod:`tuner.backends.llama_cpp.depth`)."""

from __future__ import annotations

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
