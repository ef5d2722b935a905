"""Inference backends. Each module has ``measure(spec) -> dict``, run inside the trial's child.

The result dict has lists of per-repetition samples: ``prefill_tps``, ``decode_tps``,
``ttft_s``, plus ``load_s``, ``prompt_tokens``, ``generate_tokens`` and, for the chat
workload, ``chat`` (per-turn figures of both modes).
"""
