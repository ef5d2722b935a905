"""Local refinement: one setting changed at a time around the best config, each real config once."""

from __future__ import annotations

from pathlib import Path

import optuna

from tuner import refine
from tuner.space import load_space

SPACE = ("version: 1\nparams:\n  quant: {choices: [source, Q8_0]}\n  n_threads: {low: 1, high: 4}\n"
         "  n_batch: {choices: [64, 128]}\n  n_ubatch: {choices: [64, 128]}\n  flash_attn: {choices: [true, false]}\n")


def _space(tmp_path: Path):
    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    return load_space(path).resolve(cpus=4, needed_ctx=80)


def test_neighbours_change_one_setting_nearest_value_first(tmp_path: Path) -> None:
    space = _space(tmp_path)
    start = {"quant": "source", "n_threads": 2, "n_batch": 64, "n_ubatch": 64, "flash_attn": True}
    steps = list(refine.neighbours(space, start))
    assert [name for name, _ in steps] == ["quant", "n_threads", "n_threads", "n_threads", "n_batch",
                                           "n_ubatch", "flash_attn"]
    assert [p["n_threads"] for name, p in steps if name == "n_threads"] == [1, 3, 4]
    for name, params in steps:
        assert [k for k in params if params[k] != start[k]] == [name]


def test_the_next_neighbour_skips_what_was_tried_and_configs_that_clamp_to_one(tmp_path: Path) -> None:
    space = _space(tmp_path)
    start = {"quant": "source", "n_threads": 1, "n_batch": 64, "n_ubatch": 64, "flash_attn": True}
    tried = {refine.key_of(space, {**start, "quant": "Q8_0"})}
    name, params = refine.next_neighbour(space, start, tried)
    assert name == "n_threads" and params["n_threads"] == 2
    # n_ubatch 128 with n_batch 64 is clamped to 64 by llama.cpp: the same real config as the start.
    everything = {refine.key_of(space, p) for n, p in refine.neighbours(space, start) if n != "n_ubatch"}
    assert refine.next_neighbour(space, start, everything) is None
    assert refine.next_neighbour(space, None, set()) is None


def test_params_of_refuses_a_value_the_space_does_not_offer(tmp_path: Path) -> None:
    space = _space(tmp_path)
    settings = {"backend": "llama_cpp", "quant": "Q8_0", "n_threads": 2, "n_batch": 64, "n_ubatch": 64,
                "flash_attn": False, "n_ctx": 512}
    assert refine.params_of(space, settings) == {k: settings[k] for k in
                                                 ("quant", "n_threads", "n_batch", "n_ubatch", "flash_attn")}
    assert refine.params_of(space, {**settings, "n_batch": 512}) is None


def test_a_queued_neighbour_is_asked_next_with_its_setting_noted(tmp_path: Path) -> None:
    space = _space(tmp_path)
    study = optuna.create_study()
    assert refine.enqueue_refinement(study, space, "request_time") is None  # nothing measured: no incumbent
    assert len(study.trials) == 0


def test_a_weight_type_that_broke_the_quality_guard_is_not_proposed(tmp_path: Path) -> None:
    space = _space(tmp_path)
    start = {"quant": "source", "n_threads": 1, "n_batch": 64, "n_ubatch": 64, "flash_attn": True}
    assert refine.next_neighbour(space, start, set())[0] == "quant"
    name, params = refine.next_neighbour(space, start, set(), excluded={"quant": {"Q8_0"}})
    assert name == "n_threads" and params["quant"] == "source"
