"""The chat workload: turn rendering, and what session cache reuse is worth on llama.cpp."""

from __future__ import annotations

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tuner.measure import records as R
from tuner.backends import chat
from tuner.backends.llama_cpp.backend import LlamaSession, measure_chat_llama
from tuner.backends.llama_cpp.engine import open_llama
from tuner.measure.runner import run_child
from tuner.backends.settings import TrialSettings
from tuner.config.workloads import Workload, get_workload

SYSTEM = "Answer in one line."
MESSAGES = ["Name a colour that ships use at night.", "Why that one?", "And in fog?"]


@pytest.fixture(scope="module")
def llm(model_path, repack_ok):
    """The bundled model on llama.cpp, one thread (loads in well under a second); the tests that
    use it carry the ``engine`` marker, so it lives in a forked child, never in the pytest process."""
    return open_llama({"model_path": str(model_path), "n_ctx": 1024, "n_threads": 1, "n_threads_batch": 1},
                      repack=repack_ok)


@pytest.mark.engine
@pytest.mark.parametrize("source", ["chatml", "gguf"])
def test_turn_texts_rebuild_the_whole_conversation(source, llm):
    template = chat.CHATML if source == "chatml" else llm.metadata["tokenizer.chat_template"]
    replies = ["Red.", "It is easy to see.", "A horn, not a colour."]
    texts = chat.render_turns(template, SYSTEM, MESSAGES)
    convo = [{"role": "system", "content": SYSTEM}]
    for message, reply in zip(MESSAGES, replies):
        convo += [{"role": "user", "content": message}, {"role": "assistant", "content": reply}]
    full = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        template).render(messages=convo[:-1], add_generation_prompt=True)
    assert "".join(t + r for t, r in zip(texts, replies[:-1])) + texts[-1] == full
    assert texts[0].startswith("<|im_start|>system") and texts[1].startswith("<|im_end|>")


def test_a_template_that_drops_earlier_replies_is_refused():
    last_only = "{{ messages[-1]['content'] }}"
    with pytest.raises(ValueError, match="drops earlier assistant replies"):
        chat.render_turns(last_only, SYSTEM, MESSAGES)


@pytest.mark.engine
def test_cached_session_holds_the_same_conversation_as_a_fresh_one(llm):
    workload = Workload(name="c", kind="chat", generate_tokens=8, system=SYSTEM, messages=MESSAGES)
    turns = chat.conversation_tokens(workload, llm.metadata["tokenizer.chat_template"],
                                     lambda text, first: llm.tokenize(text.encode(), add_bos=first, special=True))
    session = LlamaSession(llm)
    _, _, cached = chat.run_conversation(session, turns, 8, naive=False)
    _, _, naive = chat.run_conversation(session, turns, 8, naive=True)
    assert cached == naive  # greedy replies agree only if the cached session saw the whole history


@pytest.mark.engine
def test_a_chat_longer_than_n_ctx_is_refused_before_it_runs(model_path, repack_ok):
    small = open_llama({"model_path": str(model_path), "n_ctx": 128, "n_threads": 1}, repack=repack_ok)
    with pytest.raises(ValueError, match="raise n_ctx"):
        measure_chat_llama(small, get_workload("chat"), 1, False)


@pytest.mark.slow
def test_llama_cpp_chat_trial_cache_reuse_speedup_grows_by_turn(model_path, repack_ok):
    workload = get_workload("chat").model_copy(update={"generate_tokens": 8})
    settings = TrialSettings(backend="llama_cpp", n_ctx=1024, repack=repack_ok)
    spec = {"model_path": str(model_path), "settings": settings.model_dump(),
            "workload": workload.model_dump(), "repetitions": 2, "warmup": True}
    outcome = run_child(spec, timeout_s=120, memory_ceiling=4 * 1024**3)
    assert outcome.status == R.OK, f"{outcome.reason}\n{outcome.stderr_tail}"
    result = outcome.result
    turns = result["chat"]["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3, 4]
    contexts = [t["context_tokens"] for t in turns]
    assert contexts == [sum(t["new_tokens"] for t in turns[: i + 1]) + 8 * i for i in range(4)]
    for turn in turns[1:]:
        assert turn["ttft_cached_s"] < turn["ttft_naive_s"], turns
        assert turn["decode_cached_tps"] > 0 and turn["decode_naive_tps"] > 0
    assert turns[3]["ttft_speedup"] > turns[1]["ttft_speedup"] > 1
    assert result["prompt_tokens"] == sum(t["new_tokens"] for t in turns)
    assert result["generate_tokens"] == 32
    assert all(len(result[k]) == 2 and min(result[k]) > 0 for k in ("prefill_tps", "decode_tps", "ttft_s"))
