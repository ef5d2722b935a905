"""What `autotune serve` runs against what was measured (tuner/service/served.py): the served context and
the lines that say what differs. The bundled SmolLM2 was trained on 8192 tokens."""

from __future__ import annotations

import pytest

from tuner import AutotuneError
from tuner.backends.settings import TrialSettings
from tuner.config.model import resolve_model
from tuner.service.served import CTX_STEP, differences, served_context

GIB = 1024**3


def test_the_trained_context_is_served_when_it_fits_and_clipped_when_it_does_not() -> None:
    model = resolve_model(None)
    measured = TrialSettings(n_ctx=1024)
    assert model.context_length == 8192
    assert served_context(model, measured, model.path, 8 * GIB) == (8192, "the model's trained context")
    # Weights (~98 MB) + 64 MiB overhead + KV cache (~23 KB per f16 token): 300 MiB holds some 4000 tokens.
    n_ctx, why = served_context(model, measured, model.path, 300 * 2**20)
    assert measured.n_ctx < n_ctx < 8192 and n_ctx % CTX_STEP == 0 and "clipped" in why
    assert served_context(model, measured.model_copy(update={"type_k": "q8_0", "type_v": "q8_0"}), model.path,
                          300 * 2**20)[0] > n_ctx          # a q8_0 cache holds more tokens in the same memory
    assert served_context(model, measured, model.path, 1)[0] == 1024   # never below what was measured


def test_an_asked_context_is_served_or_refused_in_one_line() -> None:
    model = resolve_model(None)
    assert served_context(model, TrialSettings(n_ctx=1024), model.path, 8 * GIB, asked=2048) == (2048, "--ctx")
    with pytest.raises(AutotuneError, match="more than the 8192 tokens"):
        served_context(model, TrialSettings(n_ctx=1024), model.path, 8 * GIB, asked=16384)
    with pytest.raises(AutotuneError, match="does not fit the memory ceiling"):
        served_context(model, TrialSettings(n_ctx=1024), model.path, 200 * 2**20, asked=8192)


def test_the_differences_name_each_setting_and_the_engine() -> None:
    measured = {"backend": "llama_cpp", "n_ctx": 1024, "n_threads": 2}
    assert differences(measured, dict(measured), "llama-cpp-python") == []
    lines = differences(measured, {**measured, "n_ctx": 8192}, "llama-server")
    assert lines[0] == "n_ctx: measured 1024, served 8192" and "served by llama-server" in lines[1]
