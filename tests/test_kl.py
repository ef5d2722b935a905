"""KL divergence and top-token agreement of weight variants against the source (issue 29), measured in a
child process from llama-cpp-python's logits on the shipped evaluation text."""

from __future__ import annotations

import json

import pytest

from tuner.errors import AutotuneError
from tuner.backends.llama_cpp.kl import is_measured, kl_ok, measure_divergence
from tuner.config.quality import parse_max_kl
from tuner.config.model import resolve_model
from tuner.backends.llama_cpp.quant import ensure_variant, source_variant

TOKENS = 256  # enough to separate Q4_0 from Q8_0 by far; the runs score 1024


@pytest.mark.slow
def test_source_scores_zero_and_requantized_types_are_ordered() -> None:
    model = resolve_model(None)
    source = measure_divergence(source_variant(model), model, max_tokens=TOKENS)
    assert source.error is None and source.kl_mean == 0.0 and source.kl_p99 == 0.0
    assert source.top_agreement == 1.0 and source.tokens >= 200
    q8 = measure_divergence(ensure_variant(model, "Q8_0"), model, max_tokens=TOKENS)
    q4 = measure_divergence(ensure_variant(model, "Q4_0"), model, max_tokens=TOKENS)
    assert q8.error is None and q4.error is None
    assert 0 < q8.kl_mean < q4.kl_mean and q8.top_agreement >= q4.top_agreement
    assert q4.kl_p99 > q4.kl_mean  # a tail: some positions diverge far more than the mean
    again = measure_divergence(ensure_variant(model, "Q4_0"), model, max_tokens=TOKENS)
    assert again.cached and again.kl_mean == q4.kl_mean
    assert is_measured(ensure_variant(model, "Q4_0"), model, max_tokens=TOKENS)
    assert kl_ok(q8, q4.kl_mean) and not kl_ok(q4, q8.kl_mean) and kl_ok(q4, None)
    assert set(q4.facts()) == {"kl_mean", "kl_p99", "top_agreement"} and json.dumps(q4.facts())


def test_max_kl_is_parsed() -> None:
    assert parse_max_kl("0.1") == 0.1 and parse_max_kl("none") is None
    for bad in ("lots", "-1"):
        with pytest.raises(AutotuneError, match="--max-kl"):
            parse_max_kl(bad)
