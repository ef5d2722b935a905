"""Models made on the machine (benchmarks/models.py, issue 44): the tiny shape is made with the same code as
the 0.5B and 1.5B ones (seconds), checked for shape, metadata and determinism, decoded for exactly the
tokens asked by every measurement path (random weights say end-of-text at random: nothing may stop early),
and tuned for a short budget through the real CLI, so the maker cannot rot."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import models as made  # noqa: E402  (benchmarks/models.py)

from tuner.config.model import bundled_model_path, resolve_model  # noqa: E402
from tuner.errors import AutotuneError  # noqa: E402

N_TOKENS = 40


@pytest.fixture(scope="session")
def tiny(request: pytest.FixtureRequest) -> Path:
    """The tiny made GGUF (seed 0) with its Hugging Face folder, made once per test session."""
    from parallel import build_once

    folder = build_once(request, "made-tiny", lambda out: made.make_model("tiny", out, hf=True))
    return made.make_model("tiny", folder, hf=True)  # found, not made again


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_tiny_model_has_its_shape_the_bundled_tokenizer_and_says_it_is_for_speed_only(tiny: Path) -> None:
    import gguf

    shape = made.SHAPES["tiny"]
    info = resolve_model(str(tiny))
    assert (info.architecture, info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == (
        "llama", shape.n_layer, shape.n_embd, shape.n_head, shape.n_head_kv)
    assert info.file_type == "F16" or "16" in info.file_type
    reader = gguf.GGUFReader(str(tiny))
    source = gguf.GGUFReader(str(bundled_model_path()))
    tokens = source.fields["tokenizer.ggml.tokens"].contents()
    assert reader.fields["tokenizer.ggml.tokens"].contents() == tokens
    assert reader.fields["tokenizer.ggml.merges"].contents() == source.fields["tokenizer.ggml.merges"].contents()
    assert reader.fields["llama.vocab_size"].contents() == len(tokens)
    assert reader.fields[made.SPEED_ONLY_KEY].contents() is True
    assert "speed" in reader.fields["general.description"].contents()
    q = shape.n_head * shape.head_dim
    kv = shape.n_head_kv * shape.head_dim
    per_layer = 2 * shape.n_embd * q + 2 * shape.n_embd * kv + 3 * shape.n_embd * shape.n_ff + 2 * shape.n_embd
    assert info.n_params == len(tokens) * shape.n_embd + shape.n_layer * per_layer + shape.n_embd
    assert {t.tensor_type.name for t in reader.tensors} == {"F16", "F32"}
    # The Hugging Face folder is the same model for autotune (`--model FOLDER --gguf FILE`).
    from tuner.config.hf_folder import check_gguf_beside

    check_gguf_beside(resolve_model(str(made.hf_folder_of(tiny))), info)


def test_the_same_seed_makes_the_same_bytes_and_a_second_call_reuses_the_file(tiny: Path, tmp_path: Path) -> None:
    again = made.make_model("tiny", tmp_path)
    assert again.name == tiny.name and sha256(again) == sha256(tiny)
    mtime = again.stat().st_mtime_ns
    assert made.make_model("tiny", tmp_path) == again and again.stat().st_mtime_ns == mtime  # cached
    other = made.make_model("tiny", tmp_path, seed=1)
    assert other != again and sha256(other) != sha256(tiny)
    assert not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(AutotuneError, match="unknown model size"):
        made.make_model("7b", tmp_path)


def test_the_command_prints_the_file_path_last(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert made.main(["--size", "tiny", "--out", str(tiny.parent)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == str(tiny)


@pytest.mark.engine
def test_llama_cpp_decodes_exactly_the_tokens_asked_even_from_end_of_text(tiny: Path) -> None:
    """The decode loops of a llama.cpp trial (single prompt, depth probe and chat) feed N tokens whatever
    they are: started from the end-of-text token itself, the engine holds N more tokens afterwards."""
    import llama_cpp

    from tuner.backends.chat import run_conversation
    from tuner.backends.llama_cpp.backend import LlamaSession, decode, prefill

    llm = llama_cpp.Llama(str(tiny), n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False)
    eos, n_vocab = llm.token_eos(), llm.n_vocab()
    prompt = llm.tokenize(b"The quick brown fox", add_bos=False)
    llm.reset()
    _, first = prefill(llm, prompt, n_vocab)
    _, fed = decode(llm, eos, N_TOKENS, n_vocab)
    assert len(fed) == N_TOKENS and fed[0] == eos
    assert llm.n_tokens == len(prompt) + N_TOKENS
    _, fed = decode(llm, first, N_TOKENS, n_vocab)  # the model's own greedy continuation
    assert len(fed) == N_TOKENS and llm.n_tokens == len(prompt) + 2 * N_TOKENS
    turns = [prompt, llm.tokenize(b" and then", add_bos=False)]
    _, _, replies = run_conversation(LlamaSession(llm), turns, N_TOKENS, naive=False,
                                     replies=[[eos] * N_TOKENS, [eos] * N_TOKENS])
    assert [len(r) for r in replies] == [N_TOKENS, N_TOKENS]
    assert llm.n_tokens == sum(map(len, turns)) + 2 * N_TOKENS


@pytest.mark.slow
def test_transformers_decodes_exactly_the_tokens_asked_even_from_end_of_text(tiny: Path) -> None:
    """The transformers trial's decode loop, on the made Hugging Face folder (the same weights)."""
    import torch

    from tuner.backends.transformers import transformers_defaults
    from tuner.backends.transformers.backend import timed_decode
    from tuner.backends.transformers.loading import load
    from tuner.backends.transformers.session import Session

    settings = transformers_defaults(1)
    model, tokenizer, _ = load(str(made.hf_folder_of(tiny)), settings)
    session = Session(model, settings, 256)
    with torch.inference_mode():
        session.start()
        session.feed(tokenizer("The quick brown fox", add_special_tokens=False)["input_ids"])
        before = len(session.history)
        _, fed = timed_decode(session, tokenizer.eos_token_id, N_TOKENS)
    assert len(fed) == N_TOKENS and len(session.history) == before + N_TOKENS
    assert session.cache.get_seq_length() == before + N_TOKENS  # what the model really holds
