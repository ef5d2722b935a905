"""When transformers wins, the user gets transformers: `tuner.load()` returns the recommended
transformers model, loaded with the recommended settings, and `autoconfig()` says it was measured."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import pytest

import tuner
from fixtures.hf_model import hf_folder  # noqa: F401  (a fixture)
from tuner.search.tune import TuneOptions, tune

SPACE = ("version: 1\nparams:\n  backend: {choices: [transformers]}\n  dtype: {choices: [bfloat16]}\n"
         "  torch_threads: {low: 1, high: auto}\n  attn_implementation: {choices: [sdpa, eager]}\n")


@pytest.mark.slow
def test_a_transformers_recommendation_loads_as_transformers(tmp_path: Path, sqlite_url: str,
                                                            hf_folder: Path) -> None:  # noqa: F811
    # The bundled model as a Hugging Face folder: transformers loads it in seconds (the GGUF is dequantized
    # at every load), so each trial, load() and serve cost a fraction of the time.
    model = str(hf_folder)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    tune(TuneOptions(model=model, budget_s=35, space=str(space), workload="tiny", storage=sqlite_url, repetitions=1,
                     max_quality_loss=None, seed=3))
    config = tuner.autoconfig(model, workload="tiny", storage=sqlite_url)
    assert config.source == "measured" and config.backend == "transformers"
    assert config.figures["decode_tps"]["median"] > 0
    loaded = tuner.load(model, workload="tiny", storage=sqlite_url)
    assert isinstance(loaded, tuner.TransformersModel)
    s = config.settings
    assert loaded.dtype == s["dtype"]
    assert loaded.model.config._attn_implementation == s["attn_implementation"]
    assert loaded.settings.torch_threads == s["torch_threads"]
    assert loaded.settings.cache_implementation == s["cache_implementation"]
    import torch

    assert torch.get_num_threads() == s["torch_threads"]
    first = loaded.generate("The harbour", max_new_tokens=4)
    held = len(loaded._session.history)
    assert first and held > 0
    loaded.generate(" and then", max_new_tokens=2)  # a second turn is fed on top of the kept cache
    assert len(loaded._session.history) > held
    # `autotune serve` serves the same transformers pick: a real chat completion on loopback.
    from test_appconfig import _free_port, _start

    port = _free_port()
    proc, lines = _start(["serve", model, "--port", str(port), "--workload", "tiny", "--storage", sqlite_url],
                         "serving on", tmp_path)
    try:
        assert any("engine: transformers" in line for line in lines), lines
        body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(request, timeout=120).read())
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert isinstance(answer["choices"][0]["message"]["content"], str)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    # Asking for llama.cpp explicitly still gives a Llama, never a silent swap the other way.
    assert tuner.autoconfig(workload="tiny", storage=sqlite_url, backend="llama_cpp").backend == "llama_cpp"


@pytest.mark.engine
@pytest.mark.slow
def test_the_llama_server_runs_the_variant_file_without_logits_all() -> None:
    from tuner.service.appconfig import AutoConfig, weights_for
    from tuner.config.model import resolve_model
    from tuner.service.serve import llama_server_app
    from tuner.backends.settings import TrialSettings, applicable

    source = resolve_model(None).path
    settings = applicable(TrialSettings(quant="Q8_0", n_ctx=512, n_threads=1, n_threads_batch=2, repack=False))
    config = weights_for(AutoConfig(source="predicted", profile="elsewhere", settings=settings, model_path=source))
    assert config.model_path != source and Path(config.model_path).is_file()  # the Q8_0 file, made here
    _, llm = llama_server_app(TrialSettings(**config.settings), config.model_path, 8000)
    assert Path(llm.model_path) == Path(config.model_path)
    assert llm._logits_all is False  # what every trial ran; llama_cpp.server defaults to True
    assert bool(llm.model_params.use_extra_bufts) is False
