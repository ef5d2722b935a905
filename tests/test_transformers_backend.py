"""The transformers backend on the bundled model, next to llama.cpp: real engines, tiny workloads.

The model loads once for the module (dequantizing takes ~15-20 s); one test runs a whole trial
in a child process the way the search loop does. Everything uses one torch thread: on a busy
2-core machine, two threads that wait for each other make timings swing far more.
"""

from __future__ import annotations

import statistics

import pytest

from tuner.measure import records as R
from tuner.backends import transformers as tb
from tuner.backends.transformers import measure_chat_transformers
from tuner.config.model import inspect_model
from tuner.measure.runner import run_child
from tuner.backends.settings import TrialSettings
from tuner.config.workloads import Workload, get_workload, prompt_tokens

# the module fixtures are built once, on one worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("transformers_backend")]

torch = pytest.importorskip("torch")

SHORT = Workload(name="short", prompt_tokens=32, generate_tokens=8)
FIGURES = ("prefill_tps", "decode_tps", "ttft_s")
RESULT_KEYS = {*FIGURES, "prompt_tokens", "generate_tokens", "timed_s", "load_s"}
GIB = 1024**3


def torch_settings(**changes: object) -> TrialSettings:
    """A transformers config on one thread."""
    return TrialSettings(backend="transformers", torch_threads=1, **changes)


def trial_spec(model_path: object, settings: TrialSettings, workload: Workload, repetitions: int = 2) -> dict:
    """What the search loop hands to ``run_child``."""
    return {"model_path": str(model_path), "settings": settings.model_dump(),
            "workload": workload.model_dump(), "repetitions": repetitions, "warmup": True}


def assert_figures(result: dict, repetitions: int) -> None:
    """Every backend's result: one positive figure per repetition, and the shared keys."""
    assert RESULT_KEYS <= set(result)
    for key in FIGURES:
        assert len(result[key]) == repetitions and all(v > 0 for v in result[key]), key


def estimate_is_lower_bound(info, peak_rss: int) -> bool:
    """The pre-check estimate stays under what a float32 trial really took, and bfloat16 is smaller."""
    fp32 = tb.estimate_memory_bytes(info, "float32")
    return tb.estimate_memory_bytes(info, "bfloat16") < fp32 <= peak_rss


@pytest.fixture(scope="module")
def loaded(model_path):
    """The bundled model in float32 and its tokenizer, loaded once in this process."""
    torch.set_num_threads(1)
    model, tokenizer, _ = tb.load(str(model_path), torch_settings())
    return model, tokenizer


def test_transformers_trial_in_a_child_holds_dequantized_weights(model_path):
    outcome = run_child(trial_spec(model_path, torch_settings(), SHORT), timeout_s=300,
                        memory_ceiling=8 * GIB)
    assert outcome.status == R.OK, f"{outcome.reason}\n{outcome.stderr_tail}"
    result = outcome.result
    assert_figures(result, 2)
    assert result["prompt_tokens"] == 32 and result["generate_tokens"] == 8
    assert result["dtype"] == "float32" and result["attn_implementation"] == "sdpa"
    info = inspect_model(model_path)
    # Dequantized: every parameter is a 4-byte float, several times the Q4_1 file.
    assert outcome.memory.peak_rss > info.n_params * 4 > 5 * info.size_bytes
    assert estimate_is_lower_bound(info, outcome.memory.peak_rss)
    assert "Traceback" not in outcome.stderr_tail and "Warning" not in outcome.stderr_tail


def test_llama_cpp_trial_in_a_child_reports_the_same_figures(model_path, repack_ok):
    settings = TrialSettings(backend="llama_cpp", n_ctx=512, repack=repack_ok)
    outcome = run_child(trial_spec(model_path, settings, get_workload("tiny")), timeout_s=120,
                        memory_ceiling=4 * GIB)
    assert outcome.status == R.OK, f"{outcome.reason}\n{outcome.stderr_tail}"
    assert_figures(outcome.result, 2)
    assert outcome.result["prompt_tokens"] == 64


def test_both_backends_process_the_same_prompt_ids(model_path, loaded):
    from llama_cpp import Llama

    llm = Llama(str(model_path), vocab_only=True, verbose=False)
    llama_ids = prompt_tokens(lambda t: llm.tokenize(t.encode(), add_bos=False), 64, [llm.token_bos()])
    assert tb.prompt_ids(loaded[1], 64) == llama_ids


def test_every_cache_layout_generates_the_same_tokens(loaded):
    model, tokenizer = loaded
    ids = tb.prompt_ids(tokenizer, 16)
    outputs = {}
    with torch.inference_mode():
        for name, changes in {"dynamic": {}, "static": {"cache_implementation": "static"},
                              "none": {"use_cache": False}, "eager": {"attn_implementation": "eager"}}.items():
            session = tb.Session(model, torch_settings(**changes), 32)
            session.start()
            _, first = tb.timed_feed(session, ids)
            outputs[name] = tb.timed_decode(session, first, 6)[1]
    assert len(set(map(tuple, outputs.values()))) == 1, outputs


def test_use_cache_off_decodes_slower(loaded):
    model, tokenizer = loaded
    workload = Workload(name="cache-check", prompt_tokens=48, generate_tokens=6)
    with torch.inference_mode():
        on = tb.measure_single(model, tokenizer, workload, 2, True, torch_settings())
        off = tb.measure_single(model, tokenizer, workload, 2, True, torch_settings(use_cache=False))
    assert_figures({**on, "load_s": 0}, 2)
    assert statistics.median(off["decode_tps"]) < statistics.median(on["decode_tps"])


def test_chat_cached_turns_beat_naive_turns_from_the_second_on(loaded):
    model, tokenizer = loaded
    workload = Workload(name="chat-short", kind="chat", generate_tokens=4, system="Answer in one line.",
                        messages=["Name a colour that ships use at night.", "Why that one?",
                                  "Which colour would you choose instead, and why?"])
    with torch.inference_mode():
        result = measure_chat_transformers(model, tokenizer, workload, 2, True, torch_settings())
    turns = result["chat"]["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3]
    for turn in turns[1:]:
        assert turn["ttft_cached_s"] < turn["ttft_naive_s"], turns
    assert result["prompt_tokens"] == sum(t["new_tokens"] for t in turns)
    assert_figures({**result, "load_s": 0}, 2)
