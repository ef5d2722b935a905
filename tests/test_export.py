"""``autotune export`` in every format, the round trip into llama_cpp.Llama, and format versions."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from fixtures.invented import invented_db  # noqa: F401  (a fixture)

from tuner import AutotuneError
from tuner.selection import decision
from tuner.recommend import document as recommend
from tuner.cli import cli
from tuner.recommend.export import render
from tuner.recommend.query import study_view
from tuner.results.storage import open_storage


def _export(url: str, *args: str) -> tuple[int, str]:
    """Exit code and standard output (the error message when it fails)."""
    result = CliRunner().invoke(cli, ["export", "--storage", url, *args])
    return result.exit_code, result.stdout if result.exit_code == 0 else result.output


@pytest.mark.engine
@pytest.mark.slow
def test_yaml_round_trip_into_llama(invented_db: str, tmp_path: Path, model_path: Path, repack_ok: bool) -> None:
    out = tmp_path / "laptop.yaml"
    code, text = _export(invented_db, "--profile", "laptop-4c", "-o", str(out))
    assert code == 0, text
    doc = recommend.load(out)
    assert doc["version"] == recommend.FORMAT_VERSION and doc["profile"]["name"] == "laptop-4c"
    assert doc["settings"]["n_threads"] == 4 and doc["settings"]["flash_attn"] is True
    assert doc["llama_cpp_kwargs"]["model_path"] == str(model_path)
    assert doc["speedup"] == {"prefill": 1.1, "decode": 1.0}
    assert doc["llama_cpp_model_params"] == {"use_extra_bufts": True}
    llm = recommend.llama_from(out, repack=repack_ok)  # Llama(**doc["llama_cpp_kwargs"]), repacking as it runs here
    assert llm.n_ctx() == doc["llama_cpp_kwargs"]["n_ctx"]
    completion = llm.create_completion("The capital of France is", max_tokens=1, temperature=0)
    assert completion["usage"]["completion_tokens"] == 1


def test_json_is_the_same_document(invented_db: str) -> None:
    code, text = _export(invented_db, "--profile", "laptop-4c", "--format", "json")
    assert code == 0, text
    doc = json.loads(text)
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    again = study_view(open_storage(invented_db), "laptop-4c").recommendation()
    assert {k: v for k, v in doc.items() if k != "created_at"} == \
        {k: v for k, v in again.items() if k != "created_at"}


def test_llama_cpp_server_config_is_accepted(invented_db: str, tmp_path: Path, model_path: Path) -> None:
    from llama_cpp.server.settings import ConfigFileSettings

    out = tmp_path / "server.json"
    code, text = _export(invented_db, "--profile", "laptop-4c", "--format", "llama-cpp-server", "-o", str(out))
    assert code == 0, text
    (model,) = ConfigFileSettings.model_validate_json(out.read_text()).models
    assert (model.model, model.n_threads, model.n_threads_batch, model.n_ctx, model.flash_attn) == \
        (str(model_path), 4, 8, 512, True)
    assert (model.type_k, model.type_v, model.n_batch, model.n_ubatch) == (1, 1, 512, 512)


def test_llama_server_command_line(invented_db: str, model_path: Path) -> None:
    code, text = _export(invented_db, "--profile", "laptop-4c", "--format", "llama-server")
    assert code == 0, text
    assert shlex.split(text) == ["llama-server", "-m", str(model_path), "-c", "512", "-b", "512", "-ub", "512",
                                 "-t", "4", "-tb", "8", "-fa", "on", "-ctk", "f16", "-ctv", "f16", "-ngl", "0"]


def test_ollama_modelfile(invented_db: str, model_path: Path) -> None:
    code, text = _export(invented_db, "--profile", "laptop-4c", "--format", "ollama")
    assert code == 0, text
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [f"FROM {model_path}", "PARAMETER num_ctx 512", "PARAMETER num_batch 512",
                     "PARAMETER num_thread 4", "PARAMETER num_gpu 0", "PARAMETER use_mmap true"]
    assert "OLLAMA_FLASH_ATTENTION=1" in text and "n_threads_batch=8" in text


def test_pick_exports_that_measured_config(invented_db: str) -> None:
    code, text = _export(invented_db, "--profile", "desktop-16c", "--workload", "tiny", "--pick", "leanest_memory",
                         "--format", "json")
    assert code == 0, text
    doc = json.loads(text)
    lean = decision.picks(study_view(open_storage(invented_db), "desktop-16c", workload="tiny").candidates)
    assert doc["pick"] == "leanest_memory"
    assert doc["settings"] == lean["leanest_memory"].settings
    assert doc["figures"]["trials"] == list(lean["leanest_memory"].trials)
    assert doc["llama_cpp_kwargs"]["model_path"].endswith(".Q4_0.gguf")  # the quantized variant that ran


def test_from_file_upgrades_old_and_refuses_new(invented_db: str, tmp_path: Path) -> None:
    doc = study_view(open_storage(invented_db), "laptop-4c").recommendation()
    old = {**{k: v for k, v in doc.items() if k != "settings"}, "version": 0, "config": doc["settings"]}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    code, text = _export(invented_db, "--from", str(tmp_path / "old.yaml"), "--format", "json")
    assert code == 0, text
    upgraded = json.loads(text)
    assert upgraded["version"] == 1 and upgraded["settings"] == doc["settings"] and "config" not in upgraded
    (tmp_path / "new.yaml").write_text(yaml.safe_dump({**doc, "version": 99}))
    code, text = _export(invented_db, "--from", str(tmp_path / "new.yaml"), "--format", "ollama")
    assert code == 1 and text.count("\n") == 1
    assert "format version 99, newer than this autotune reads (1): upgrade autotune" in text


@pytest.mark.parametrize("fmt", ["llama-server", "llama-cpp-server", "ollama"])
def test_llama_formats_refuse_another_backend(invented_db: str, fmt: str) -> None:
    doc = study_view(open_storage(invented_db), "laptop-4c").recommendation()
    other = {k: v for k, v in doc.items() if k not in ("llama_cpp_kwargs", "llama_server_args")}
    other["settings"] = {"backend": "transformers", "torch_threads": 4, "dtype": "float32"}
    with pytest.raises(AutotuneError, match=f"transformers backend: --format {fmt} needs a llama.cpp config"):
        render(other, fmt)


@pytest.mark.parametrize("fmt", ["llama-server", "llama-cpp-server", "ollama"])
def test_a_format_that_names_the_weights_refuses_a_file_that_is_gone(invented_db: str, tmp_path: Path,
                                                                      fmt: str) -> None:
    doc = study_view(open_storage(invented_db), "laptop-4c").recommendation()
    gone = tmp_path / "model-Q5_K_M.gguf"
    doc["llama_cpp_kwargs"] = {**doc["llama_cpp_kwargs"], "model_path": str(gone)}
    (tmp_path / "rec.yaml").write_text(yaml.safe_dump(doc))
    code, text = _export(invented_db, "--from", str(tmp_path / "rec.yaml"), "--format", fmt)
    assert code == 1 and text.count("\n") == 1 and f"{gone}, no longer exists" in text, text
    assert "autotune run --model" in text
    code, text = _export(invented_db, "--from", str(tmp_path / "rec.yaml"), "--format", "yaml")
    assert code == 0 and str(gone) in text   # the document itself exports as it is
