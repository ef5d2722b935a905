"""A Hugging Face model folder as the model to tune (issue 28, item 3): its facts read from config.json and the
safetensors headers, the backends that cannot load it left out of the space, and a real run on a folder made
from the bundled GGUF."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixtures.hf_model import hf_folder  # noqa: F401  (a fixture)

from tuner.cli import cli
from tuner.config.hf_folder import FORMAT, check_gguf_beside
from tuner.config.model import inspect_model, resolve_model
from tuner.errors import AutotuneError
from tuner.search.space import DEFAULT_SPACE, load_space

CONFIG = {"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
          "num_hidden_layers": 2, "max_position_embeddings": 2048}


def _safetensors(path: Path, tensors: dict[str, list[int]], cut: int = 0) -> Path:
    """A real safetensors file of float32 zeros with these tensor shapes (``cut`` bytes short)."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4 * (shape[0] * (shape[1] if len(shape) > 1 else 1))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset - cut))
    return path


def _folder(tmp_path: Path, config: dict | None = None, **tensors_cut: int) -> Path:
    folder = tmp_path / "tiny-hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config or CONFIG))
    _safetensors(folder / "model.safetensors", {"embed": [16, 8], "norm": [8]}, cut=tensors_cut.get("cut", 0))
    return folder


def test_a_model_folders_facts_come_from_its_config_and_safetensors_headers(tmp_path: Path) -> None:
    info = inspect_model(_folder(tmp_path))
    assert info.format == FORMAT and info.architecture == "llama" and info.file_type == "F32"
    assert (info.n_layer, info.n_embd, info.n_head, info.n_head_kv, info.head_dim_k) == (2, 8, 2, 1, 4)
    assert info.context_length == 2048 and info.n_params == 16 * 8 + 8
    assert info.name == "tiny-hf" and len(info.sha256) == 64
    # The id follows the content: a changed config is another model.
    (tmp_path / "tiny-hf" / "config.json").write_text(json.dumps({**CONFIG, "max_position_embeddings": 4096}))
    assert inspect_model(tmp_path / "tiny-hf").sha256 != info.sha256


@pytest.mark.parametrize(("breakage", "words"), [
    ("no weights", "no \\*.safetensors weights"),
    ("truncated", "truncated"),
    ("not safetensors", "not a safetensors file"),
    ("bad config", "config.json cannot be read"),
])
def test_a_broken_model_folder_is_one_clear_error(tmp_path: Path, breakage: str, words: str) -> None:
    folder = _folder(tmp_path, cut=40 if breakage == "truncated" else 0)
    if breakage == "no weights":
        (folder / "model.safetensors").unlink()
    elif breakage == "not safetensors":
        (folder / "model.safetensors").write_bytes(b"GGUF" + bytes(100))
    elif breakage == "bad config":
        (folder / "config.json").write_text("{not json")
    with pytest.raises(AutotuneError, match=words):
        inspect_model(folder)


def test_a_folder_without_config_is_refused_with_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(AutotuneError, match="folder without config.json"):
        inspect_model(tmp_path)


def test_the_default_space_leaves_out_the_backends_that_cannot_load_a_folder(tmp_path: Path) -> None:
    space = load_space(DEFAULT_SPACE)
    resolved = space.resolve(2, 1024, 8192, 512, model_format=FORMAT)
    assert resolved.backends == ("transformers",)
    assert not {"quant", "n_threads", "flash_attn"} & set(resolved.distributions)
    assert {"dtype", "torch_threads"} <= set(resolved.distributions)
    assert any("llama_cpp left out" in note for note in resolved.notes)
    assert space.resolve(2, 1024, 8192, 512).backends == ("llama_cpp", "transformers")  # a GGUF: both
    only_llama = tmp_path / "llama.yaml"
    only_llama.write_text("version: 1\nparams:\n  n_threads: {low: 1, high: auto}\n")
    with pytest.raises(AutotuneError, match="cannot load a model of format hf-folder.*transformers"):
        load_space(only_llama).resolve(2, 1024, 8192, 512, model_format=FORMAT)


def test_gguf_beside_a_folder_must_be_that_models_gguf(tmp_path: Path) -> None:
    folder, gguf = inspect_model(_folder(tmp_path)), resolve_model(None)
    with pytest.raises(AutotuneError, match="is not the model in"):
        check_gguf_beside(folder, gguf)               # another model (SmolLM2 beside a 2-layer toy)
    with pytest.raises(AutotuneError, match="--gguf goes with a Hugging Face model folder"):
        check_gguf_beside(gguf, gguf)                 # --gguf without a folder as --model
    with pytest.raises(AutotuneError, match="is not a GGUF file"):
        check_gguf_beside(folder, folder)
    resolved = load_space(DEFAULT_SPACE).resolve(2, 1024, 8192, 512, model_format=(FORMAT, "gguf"))
    assert resolved.backends == ("llama_cpp", "transformers") and not resolved.notes   # both load one of them


@pytest.mark.slow
def test_autotune_run_tunes_a_model_folder_made_from_the_bundled_gguf(hf_folder: Path,  # noqa: F811
                                                                      sqlite_url: str, tmp_path: Path) -> None:
    info, gguf = inspect_model(hf_folder), resolve_model(None)
    # The same model as the GGUF it was made from, in float32 safetensors.
    assert info.format == FORMAT and info.file_type == "F32" and info.architecture == gguf.architecture
    assert (info.n_layer, info.n_embd, info.context_length) == (gguf.n_layer, gguf.n_embd, gguf.context_length)
    assert info.n_params == gguf.n_params and info.size_bytes > 500e6
    written = tmp_path / "rec.yaml"
    result = CliRunner().invoke(cli, ["run", "--model", str(hf_folder), "--budget", "60", "--workload", "tiny",
                                      "--storage", sqlite_url, "--repetitions", "1", "-o", str(written)])
    assert result.exit_code == 0, result.output
    assert "llama_cpp left out" in " ".join(result.output.split())
    import tuner

    rec = tuner.load_recommendation(written)
    assert rec["settings"]["backend"] == "transformers" and rec["model"]["sha256"] == info.sha256
    # An application finds the folder's tuned settings, as measured, for the folder it names.
    config = tuner.autoconfig(str(hf_folder), workload="tiny", storage=sqlite_url)
    assert config.source == "measured" and config.backend == "transformers"
    assert Path(config.model_path) == hf_folder.resolve()


@pytest.mark.alone  # measures speed, or needs every CPU (tests/parallel.py)
@pytest.mark.slow
def test_a_folder_and_its_gguf_compete_in_one_study(hf_folder: Path, sqlite_url: str,  # noqa: F811
                                                    model_path: Path) -> None:
    import optuna

    from tuner.measure.records import record_of
    from tuner.results.storage import open_storage
    from tuner.search.tune import TuneOptions, tune

    result = tune(TuneOptions(model=str(hf_folder), gguf=str(model_path), budget_s=60, workload="tiny",
                              storage=sqlite_url, repetitions=1, max_quality_loss=None, seed=1))
    study = optuna.load_study(study_name=result.study_name, storage=open_storage(sqlite_url).rdb)
    ran = {(r.backend, r.model.get("path")) for r in (record_of(t) for t in study.get_trials()) if r and r.outcome.ok}
    # llama.cpp ran the GGUF (or a variant made from it), transformers the folder, in the same study.
    assert ("transformers", str(hf_folder.resolve())) in ran
    assert any(b == "llama_cpp" and p and p.endswith(".gguf") for b, p in ran), ran
    assert inspect_model(hf_folder).short_id[:8] in result.study_name
    if len(os.sched_getaffinity(0)) < 2:
        return
    # Another machine (one CPU: another profile) that has the folder alone gets a prediction it can run: not
    # the llama.cpp config of a GGUF it lacks; asked for llama.cpp, it is told what to pass.
    import tuner

    before = os.sched_getaffinity(0)
    try:
        config = tuner.autoconfig(str(hf_folder), workload="tiny", storage=sqlite_url, cpus=[0])
        assert config.backend == "transformers" and Path(config.model_path) == hf_folder.resolve()
        with pytest.raises(AutotuneError, match="runs a GGUF file"):
            tuner.load(str(hf_folder), workload="tiny", storage=sqlite_url, cpus=[0], backend="llama_cpp")
    finally:
        os.sched_setaffinity(0, before)
