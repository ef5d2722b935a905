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
    memory = llama_cpp.llama_get_memory(llm._ctx.ctx)  # the engine's own count agrees
    assert llama_cpp.llama_memory_seq_pos_max(memory, 0) + 1 == llm.n_tokens


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


@pytest.mark.slow
def test_llama_server_answers_exactly_the_tokens_asked(tiny: Path, tmp_path: Path) -> None:
    """The serve workload's requests (``ignore_eos``): llama-server streams every token asked for, even with
    end-of-text pushed to the top of every step (a logit bias), where a request without it stops at once."""
    import asyncio

    import httpx

    from tuner.backends.llama_cpp.server_binary import find_llama_server
    from tuner.backends.llama_cpp.server_process import LlamaServer, serving_flags
    from tuner.backends.settings import defaults
    from tuner.measure.serving_client import Load, _request, answer_tokens, messages_for

    try:
        binary = str(find_llama_server(build=False).path)
    except AutotuneError as exc:
        pytest.skip(f"{exc} (.ci/run builds it before the tests)")
    settings = defaults("llama_cpp", 1, 1024, serving=True).model_copy(
        update={"n_parallel": 1, "n_threads": 1, "n_threads_batch": 1, "n_ctx": 1024})
    eos = 2  # SmolLM2's <|im_end|> (tokenizer.ggml.eos_token_id)
    load = Load(users=1, prompt="The quick brown fox jumps over the lazy dog. " * 8, max_tokens=N_TOKENS,
                duration_s=1.0, extra_body={"logit_bias": {str(eos): 100}})

    async def ask(base_url: str) -> tuple[list, dict]:
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            results = [await _request(client, load, 0, number, 0.0) for number in range(3)]
            plain = await client.post("/v1/chat/completions", json={
                "messages": messages_for(load, 0, 0), "max_tokens": N_TOKENS, "temperature": 0.0, **load.extra_body})
            return results, plain.json()["usage"]

    with LlamaServer(binary, serving_flags(settings, str(tiny)), tmp_path / "llama-server.log") as server:
        results, plain = asyncio.run(ask(server.base_url))
    assert plain["completion_tokens"] == 1  # without ignore_eos the pushed end-of-text ends the answer
    for number, result in enumerate(results):
        assert result.ok, result.error
        assert result.output_tokens == answer_tokens(load, 0, number)


@pytest.mark.slow
def test_autotune_tunes_the_tiny_made_model(tiny: Path, tmp_path: Path) -> None:
    """A short real run on the made file, with both backends' baselines and the default space; its quality
    figures mean nothing on random weights, so the run is told not to guard quality."""
    import optuna
    from click.testing import CliRunner

    from tuner import load_recommendation
    from tuner.cli import cli
    from tuner.measure.records import record_of
    from tuner.results.storage import open_storage

    url, out = f"sqlite:///{tmp_path / 'autotune.db'}", tmp_path / "rec.yaml"
    result = CliRunner().invoke(cli, [
        "run", "--model", str(tiny), "--budget", "45s", "--workload", "tiny", "--storage", url,
        "--max-quality-loss", "none", "--max-kl", "none", "--repetitions", "2", "--trial-timeout", "60s",
        "--seed", "5", "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"Recommendation written to {out}" in result.output.replace("\n", "")
    (summary,) = optuna.get_all_study_summaries(open_storage(url).rdb)
    assert tiny.stem in summary.study_name
    trials = optuna.load_study(study_name=summary.study_name, storage=open_storage(url).rdb).get_trials()
    records = [record_of(t) for t in trials]
    assert records[0].role == "baseline" and any(r.role == "search" for r in records)
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) >= 2
    doc = load_recommendation(out)
    assert doc["model"]["path"] == str(tiny) and doc["figures"]["decode_tps"]["median"] > 0


def test_autotune_reads_a_made_model_as_speed_only(tiny: Path) -> None:
    """The made file's ``autotune.speed_only`` reaches the run (no quality guard, one note) and the
    recommendation (quality figures marked as not meaningful); the bundled model's guards stay on."""
    from tuner.backends.settings import defaults
    from tuner.config.model import SPEED_ONLY_NOTE
    from tuner.measure.records import Stat
    from tuner.recommend import document
    from tuner.search.options import TuneOptions, speed_only
    from tuner.selection.candidates import Candidate

    info, bundled = resolve_model(str(tiny)), resolve_model(None)
    assert info.speed_only and not bundled.speed_only
    asked = TuneOptions(max_quality_loss=0.05, max_kl=0.1)
    assert speed_only(asked, (bundled, None)) == (asked, None)
    options, note = speed_only(asked, (bundled, info))  # a folder with the made GGUF beside it (--gguf)
    assert (options.max_quality_loss, options.max_kl) == (None, None) and options.budget_s == asked.budget_s
    assert note is not None and SPEED_ONLY_NOTE in note and tiny.name in note
    settings = defaults("llama_cpp", 1, 1024).model_dump()
    cand = Candidate(config_key="k", settings=settings, trials=(0,), roles=("baseline",), prefill=Stat.of([100.0]),
                     decode=Stat.of([20.0]), ttft=None, peak_rss=1)
    row = {"quant": "Q4_0", "perplexity": 9e4, "quality_loss": 0.3, "kl_mean": 2.0, "kl_p99": 5.0,
           "top_agreement": 0.1, "feasible": False}
    for model, meaningful in ((info, False), (bundled, None)):
        doc = document.build(profile={"name": "p"}, model=model.public(), workload={"name": "tiny"},
                             objective="request_time", study="s", storage="sqlite://", chosen=cand, baseline=None,
                             extra={"quants": [dict(row)]})
        assert (doc.get("quality") or {}).get("meaningful") is meaningful
        quants = doc["quants"][0]
        assert (quants["perplexity"] is None and quants["feasible"]) if meaningful is False else quants == row


@pytest.mark.slow
def test_a_run_on_a_made_model_turns_the_quality_guards_off_by_itself(tiny: Path, tmp_path: Path) -> None:
    """Without ``--max-quality-loss none --max-kl none``: the run reads the file's speed-only mark, says the
    guards are off in one line, measures no perplexity, and the recommendation marks quality as not meaningful."""
    from click.testing import CliRunner

    from tuner import load_recommendation
    from tuner.cli import cli
    from tuner.config.model import SPEED_ONLY_NOTE

    out = tmp_path / "rec.yaml"
    result = CliRunner().invoke(cli, [
        "run", "--model", str(tiny), "--budget", "30s", "--workload", "tiny", "--storage",
        f"sqlite:///{tmp_path / 'autotune.db'}", "--repetitions", "1", "--seed", "3", "-o", str(out)],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert said.count(f"{tiny.name} is made for speed measurements") == 1 and SPEED_ONLY_NOTE in said  # one status line
    assert said.count(SPEED_ONLY_NOTE) == 2  # ... and the recommendation's table says it again
    doc = load_recommendation(out)
    assert doc["model"]["speed_only"] is True and doc["quality"]["meaningful"] is False
    assert all(row["perplexity"] is None for row in doc.get("quants", []))


@pytest.mark.slow
def test_a_dequantized_gguf_is_kept_and_loads_the_same_model(tiny: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The first transformers load of a GGUF file keeps its dequantized copy; the next one loads the copy
    (no dequantization: a transformers trial's setup cost) and holds the very same model."""
    import torch

    from tuner.backends.transformers import transformers_defaults
    from tuner.backends.transformers.loading import dequantized_folder, load

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    settings = transformers_defaults(1)
    copy = dequantized_folder(tiny, settings.dtype)
    assert not copy.exists()
    load(str(tiny), settings)  # tuner.load() for a user: no copy made
    assert not copy.exists()
    first, tokenizer, _ = load(str(tiny), settings, keep=True)  # a trial's child
    assert (copy / "config.json").is_file() and not list(copy.parent.glob(".*"))
    again, tokenizer_again, _ = load(str(tiny), settings)
    text = "The quick brown fox"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer_again(text, add_special_tokens=False)["input_ids"] == ids
    with torch.inference_mode():
        assert torch.equal(first(torch.tensor([ids])).logits, again(torch.tensor([ids])).logits)
    assert again.dtype == first.dtype == getattr(torch, settings.dtype)
