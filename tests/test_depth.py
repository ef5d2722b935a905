"""Decode at a filled context (issue 29): the depth asked is the depth the engine decodes at, a filled
context decodes slower than a short one, and the figures reach the stored trials with their samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TINY_SPACE
from fixtures.hf_model import hf_folder  # noqa: F401  (a fixture)

from tuner.config.depth import depth_decode_tokens, parse_depth, resolve_depth
from tuner.errors import AutotuneError
from tuner.measure.runner import run_child
from tuner.backends.settings import TrialSettings
from tuner.config.workloads import get_workload, with_depth


def test_depth_is_parsed_and_resolved() -> None:
    assert parse_depth("75%") == "75%" and parse_depth("2048") == 2048 and parse_depth(None) is None
    for bad in ("0", "150%", "deep"):
        with pytest.raises(ValueError):
            parse_depth(bad)
    assert resolve_depth("75%", 2048, 80, 16) == (1536, "")
    assert resolve_depth(None, 2048, 80, 16) == (80, "")  # the workload's own end
    depth, note = resolve_depth(4000, 2048, 80, 16)
    assert depth == 2032 and "capped" in note
    assert depth_decode_tokens(128) == 16 and depth_decode_tokens(8) == 8
    workload = with_depth(get_workload("tiny"), "2048")
    assert workload.name == "tiny@2048" and workload.needed_ctx() >= 2048 + 16
    with pytest.raises(AutotuneError, match="--depth"):
        with_depth(get_workload("tiny"), "lots")


def _measure(model_path: Path, depth: str, flash_attn: bool) -> dict:
    settings = TrialSettings(backend="llama_cpp", quant="source", n_threads=1, n_threads_batch=1, n_batch=512,
                             n_ubatch=512, n_ctx=1024, flash_attn=flash_attn, repack=False)
    spec = {"model_path": str(model_path), "settings": settings.model_dump(),
            "workload": with_depth(get_workload("tiny"), depth).model_dump(), "repetitions": 3, "warmup": True}
    outcome = run_child(spec, timeout_s=240, memory_ceiling=None)
    assert outcome.ok, outcome.reason
    return outcome.result


@pytest.mark.slow
def test_decode_at_depth_is_measured_at_the_depth_asked(model_path: Path) -> None:
    """n_past in the engine (llama_memory_seq_pos_max + 1) before every timed decode at depth is the
    depth asked: filled up to 75% of n_ctx (1024: 768 tokens) on top of the prompt, or cut back below the
    prompt's end."""
    slower = []
    for flash_attn in (False, True):
        deep = _measure(model_path, "75%", flash_attn)
        assert deep["depth"] == 768 and deep["depth_n_past"] == [768] * 3
        assert len(deep["decode_depth_tps"]) == len(deep["decode_tps"]) == 3
        slower.append(sorted(deep["decode_depth_tps"])[1] < sorted(deep["decode_tps"])[1])
    assert any(slower), "decode with 768 tokens in the cache was never slower than after a 64-token prompt"
    cut = _measure(model_path, "40", False)  # the tiny workload ends at 80: the cache is cut back to 40
    assert cut["depth"] == 40 and cut["depth_n_past"] == [40] * 3


@pytest.mark.slow
def test_trials_json_shows_both_decode_figures(tmp_path: Path) -> None:
    space = tmp_path / "tiny.yaml"
    space.write_text(TINY_SPACE)
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    result = CliRunner().invoke(__import__("tuner.cli", fromlist=["cli"]).cli, [
        "run", "--budget", "40s", "--workload", "tiny", "--depth", "200", "--space", str(space), "--storage", url,
        "--repetitions", "2", "--max-quality-loss", "none", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "decode at depth 200" in result.output
    out = CliRunner().invoke(__import__("tuner.cli", fromlist=["cli"]).cli,
                             ["trials", "--storage", url, "--format", "json"])
    rows = [r for r in json.loads(out.stdout)["trials"] if r["state"] == "complete"]
    assert rows
    for row in rows:
        assert len(row["decode_tps"]["samples"]) == len(row["decode_depth_tps"]["samples"]) >= 1
        assert row["depth"] == 200


def test_long_prompt_and_chat_rank_by_decode_at_depth() -> None:
    """The shipped workloads file (read from this checkout): the workloads that live at depth rank there."""
    import yaml

    from tuner.util.paths import PROJECT_ROOT
    from tuner.config.workloads import Workload

    shipped = yaml.safe_load((PROJECT_ROOT / "search_spaces" / "workloads.yaml").read_text())["workloads"]
    ranked = {name for name, body in shipped.items() if Workload(name=name, **body).rank_at_depth}
    assert ranked == {"long-prompt", "chat"}


@pytest.mark.slow
def test_transformers_decodes_at_the_depth_asked(hf_folder: Path) -> None:  # noqa: F811
    """The torch session: cut back below the end (dynamic cache) and filled beyond it (static cache). The
    bundled model as a Hugging Face folder: loaded in seconds where the GGUF is dequantized at every load."""
    from tuner.backends.transformers import transformers_defaults

    for depth, changes in (("40", {}), ("200", {"cache_implementation": "static"})):
        settings = transformers_defaults(1).model_copy(update=changes)
        spec = {"model_path": str(hf_folder), "settings": settings.model_dump(),
                "workload": with_depth(get_workload("tiny"), depth).model_dump(), "repetitions": 2, "warmup": True}
        outcome = run_child(spec, timeout_s=300, memory_ceiling=None)
        assert outcome.ok, outcome.reason
        assert outcome.result["depth_n_past"] == [int(depth)] * 2 and len(outcome.result["decode_depth_tps"]) == 2
