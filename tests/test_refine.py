"""Local refinement: one setting changed at a time around the best config, each real config once."""

from __future__ import annotations

from pathlib import Path

import optuna

from tuner.search import refine
from tuner.search.space import load_space

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
    # The screened settings first, binary switches leading (flash attention), batch sizes after them.
    assert [name for name, _ in steps] == ["flash_attn", "quant", "n_threads", "n_threads", "n_threads", "n_batch",
                                           "n_ubatch"]
    assert [p["n_threads"] for name, p in steps if name == "n_threads"] == [1, 3, 4]
    for name, params in steps:
        assert [k for k in params if params[k] != start[k]] == [name]


def test_the_next_neighbour_skips_what_was_tried_and_configs_that_clamp_to_one(tmp_path: Path) -> None:
    space = _space(tmp_path)
    start = {"quant": "source", "n_threads": 1, "n_batch": 64, "n_ubatch": 64, "flash_attn": True}
    tried = {refine.key_of(space, {**start, "quant": "Q8_0"}), refine.key_of(space, {**start, "flash_attn": False})}
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
    fa_off = {refine.key_of(space, {**start, "flash_attn": False})}
    assert refine.next_neighbour(space, start, fa_off)[0] == "quant"
    name, params = refine.next_neighbour(space, start, fa_off, excluded={"quant": {"Q8_0"}})
    assert name == "n_threads" and params["quant"] == "source"


def test_what_the_informed_start_fixed_is_screened_first(tmp_path: Path) -> None:
    # The informed start turns flash attention on (it wins on the AMD kind); on the Intel AMX kind it
    # decodes 45-55% slower. The first neighbour measured is the same config with it off.
    space = _space(tmp_path)
    informed = {"quant": "Q8_0", "n_threads": 4, "n_batch": 64, "n_ubatch": 64, "flash_attn": True}
    name, params = refine.next_neighbour(space, informed, set())
    assert name == "flash_attn" and params == {**informed, "flash_attn": False}


def test_a_similar_machines_effects_order_the_screening() -> None:
    from tuner.selection import candidates as select
    from tuner.measure.records import Stat

    def cand(seconds: float, **settings) -> select.Candidate:
        stat = Stat.of([seconds] * 3)
        return select.Candidate(config_key=str(settings), settings={"backend": "llama_cpp", **settings}, trials=(0,),
                                roles=("search",), prefill=stat, decode=stat, ttft=stat, peak_rss=1, request=stat)

    base = dict(quant="Q8_0", n_threads=2, flash_attn=True, type_k="f16")
    stored = [cand(3.0, **base), cand(1.5, **{**base, "quant": "Q4_0"}), cand(2.9, **{**base, "flash_attn": False}),
              cand(2.0, **{**base, "n_threads": 1, "quant": "Q4_0", "flash_attn": False})]  # 2+ apart: no evidence
    effects = refine.setting_effects(stored, "request_time")
    assert set(effects) == {"quant", "flash_attn"} and effects["quant"] > effects["flash_attn"] > 0
    order = refine.screen_order("llama_cpp", effects)
    assert order[:2] == ["quant", "flash_attn"] and order[2:] == ["repack", "n_threads", "n_threads_batch",
                                                                  "type_k", "type_v"]
    assert refine.screen_order("llama_cpp")[0] == "flash_attn"   # no similar machine: the fixed order


def test_the_weight_type_screen_tries_the_nearest_size_first(tmp_path: Path) -> None:
    # From Q8_0 the next step down (Q6_K) is measured before the far end of the space's list (the
    # source file's type first, F16 last): on the 2-vCPU EPYC of family 23 a 5-minute run had time for
    # one weight-type step, and Q6_K was that machine's best.
    path = tmp_path / "space.yaml"
    path.write_text("version: 1\nparams:\n  quant: {choices: [source, Q8_0, Q4_0, Q6_K, F16, Q5_K_M]}\n")
    space = load_space(path).resolve(cpus=2, needed_ctx=80)
    order = [p["quant"] for name, p in refine.neighbours(space, {"quant": "Q8_0"}) if name == "quant"]
    assert order == ["Q6_K", "Q5_K_M", "F16", "Q4_0", "source"]
    # From the source file, whose type the space does not say, the file's order stays.
    assert [p["quant"] for _, p in refine.neighbours(space, {"quant": "source"})] == ["Q8_0", "Q4_0", "Q6_K", "F16",
                                                                                       "Q5_K_M"]
    assert [p["quant"] for _, p in refine.neighbours(space, {"quant": "Q4_0"})][:2] == ["Q5_K_M", "Q6_K"]


def _measured(study: optuna.Study, space, params: dict, seconds: float, repacked_mib: float | None) -> None:
    from fixtures.stored import add_measured

    add_measured(study, space.suggest(optuna.trial.FixedTrial(params)), seconds,  # the config the space's params make
                 extra=None if repacked_mib is None else {"repacked_mib": repacked_mib})


def test_repacking_is_not_flipped_for_weights_that_nothing_was_repacked_for(tmp_path: Path) -> None:
    # On an AVX2 EPYC llama.cpp loads Q8_0 into its plain buffer with repacking on (0 MiB repacked): repacking
    # off would measure the same program. Q4_0 repacks there, so its repacking is screened.
    path = tmp_path / "space.yaml"
    path.write_text("version: 1\nparams:\n  quant: {choices: [Q8_0, Q4_0]}\n  repack: {choices: [true, false]}\n"
                    "  flash_attn: {choices: [true, false]}\n")
    space = load_space(path).resolve(cpus=2, needed_ctx=80)
    q8 = {"quant": "Q8_0", "repack": True, "flash_attn": True}
    study = optuna.create_study(direction="minimize")
    _measured(study, space, q8, 5.5, repacked_mib=0.0)
    _measured(study, space, {**q8, "flash_attn": False}, 5.7, repacked_mib=0.0)
    assert refine.enqueue_refinement(study, space, "request_time") == "quant"  # not repack
    unknown = optuna.create_study(direction="minimize")  # a load log that said nothing: screened as before
    _measured(unknown, space, q8, 5.5, repacked_mib=None)
    _measured(unknown, space, {**q8, "flash_attn": False}, 5.7, repacked_mib=None)
    assert refine.enqueue_refinement(unknown, space, "request_time") == "repack"
    q4 = optuna.create_study(direction="minimize")
    _measured(q4, space, {**q8, "quant": "Q4_0"}, 5.0, repacked_mib=56.95)
    _measured(q4, space, {**q8, "quant": "Q4_0", "flash_attn": False}, 5.2, repacked_mib=56.95)
    _measured(q4, space, q8, 5.5, repacked_mib=0.0)
    assert refine.enqueue_refinement(q4, space, "request_time") == "repack"
