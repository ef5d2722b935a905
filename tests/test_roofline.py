"""Decode against the memory-bandwidth roofline, computed in one place (tuner/backends/roofline.py)."""

from __future__ import annotations

import pytest

from tuner.backends.roofline import decode_roofline
from tuner.config.model import resolve_model


def test_a_token_reads_the_weights_and_the_kv_cache_at_its_mean_depth() -> None:
    model = resolve_model(None).public()   # the bundled SmolLM2: its real layer and head counts
    settings = {"backend": "llama_cpp", "type_k": "f16", "type_v": "f16"}
    short = decode_roofline("llama_cpp", model, settings, 100e6, 0, 0, 50.0, 20.0)
    deep = decode_roofline("llama_cpp", model, settings, 100e6, 512, 128, 50.0, 20.0)
    assert short is not None and deep is not None
    assert short.bytes_per_token == pytest.approx(100e6)          # no context: the weights alone
    assert deep.bytes_per_token > short.bytes_per_token            # 576 tokens of KV cache on top
    assert deep.efficiency == pytest.approx(50.0 * deep.bytes_per_token / 20e9)
    assert deep.facts()["decode_efficiency"] == round(deep.efficiency, 4)
    q8 = decode_roofline("llama_cpp", model, {**settings, "type_k": "q8_0", "type_v": "q8_0"}, 100e6, 512, 128, 50.0,
                         20.0)
    assert q8.bytes_per_token < deep.bytes_per_token               # a q8_0 cache reads about half the bytes


def test_no_roofline_without_a_decode_a_bandwidth_or_a_model_of_the_bytes() -> None:
    model = resolve_model(None).public()
    assert decode_roofline("llama_cpp", model, {}, 100e6, 512, 128, None, 20.0) is None
    assert decode_roofline("llama_cpp", model, {}, 100e6, 512, 128, 50.0, None) is None
    assert decode_roofline("transformers", model, {"backend": "transformers"}, 100e6, 512, 128, 50.0, 20.0) is None
