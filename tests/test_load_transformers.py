"""When transformers wins, the user gets transformers: `tuner.load()` returns the recommended
transformers model, loaded with the recommended settings, and `autoconfig()` says it was measured."""

from __future__ import annotations

from pathlib import Path

import pytest

import tuner
from tuner.search import TuneOptions, tune

SPACE = ("version: 1\nparams:\n  backend: {choices: [transformers]}\n  dtype: {choices: [bfloat16]}\n"
         "  torch_threads: {low: 1, high: auto}\n  attn_implementation: {choices: [sdpa, eager]}\n")


@pytest.mark.slow
def test_a_transformers_recommendation_loads_as_transformers(tmp_path: Path, sqlite_url: str) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    tune(TuneOptions(budget_s=60, space=str(space), workload="tiny", storage=sqlite_url, repetitions=1,
                     max_quality_loss=None, seed=3))
    config = tuner.autoconfig(workload="tiny", storage=sqlite_url)
    assert config.source == "measured" and config.backend == "transformers"
    assert config.figures["decode_tps"]["median"] > 0
    loaded = tuner.load(workload="tiny", storage=sqlite_url)
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
    # Asking for llama.cpp explicitly still gives a Llama, never a silent swap the other way.
    assert tuner.autoconfig(workload="tiny", storage=sqlite_url, backend="llama_cpp").backend == "llama_cpp"
