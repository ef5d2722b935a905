"""Informed starts: built from the resolved space, queued once, asked next, and never outside the space."""

from __future__ import annotations

from pathlib import Path

import optuna

from tuner.search.informed import INFORMED_ATTR, decode_threads, enqueue_next, informed_configs
from tuner.search.space import load_space

REPO = Path(__file__).resolve().parent.parent


def test_default_space_gets_one_start_per_backend() -> None:
    space = load_space(REPO / "search_spaces" / "cpu.yaml").resolve(cpus=4, needed_ctx=640)
    llama, hf = informed_configs(space, physical_cores=2, logical_cores=4)
    assert llama == {"backend": "llama_cpp", "quant": "Q8_0", "n_threads": 2, "n_threads_batch": 4,
                     "n_batch": 512, "n_ubatch": 512, "flash_attn": True, "type_k": "f16", "type_v": "f16",
                     "use_mmap": True, "repack": True, "n_ctx": 1024}
    assert hf["backend"] == "transformers" and hf["dtype"] == "bfloat16" and hf["torch_threads"] == 4
    assert not set(hf) & {"quant", "n_threads", "flash_attn"}


def test_only_values_the_space_allows_are_fixed(tmp_path: Path) -> None:
    path = tmp_path / "narrow.yaml"
    path.write_text("version: 1\nparams:\n  n_threads: {low: 1, high: auto}\n"
                    "  n_batch: {choices: [64, 128]}\n  flash_attn: {choices: [false]}\n")
    space = load_space(path).resolve(cpus=1, needed_ctx=80)
    # 512 is not a choice and flash attention is excluded: both are left to the sampler.
    assert informed_configs(space, physical_cores=8, logical_cores=16) == [{"n_threads": 1}]


def test_decode_threads_is_one_per_physical_core() -> None:
    assert decode_threads(cpus=8, physical_cores=4, logical_cores=8) == 4
    assert decode_threads(cpus=2, physical_cores=2, logical_cores=2) == 2
    assert decode_threads(cpus=1, physical_cores=16, logical_cores=32) == 1


def test_each_start_is_queued_once_and_asked_next() -> None:
    space = load_space(REPO / "search_spaces" / "cpu.yaml").resolve(cpus=2, needed_ctx=640)
    study = optuna.create_study(directions=["maximize", "maximize"])
    asked = []
    for _ in range(4):
        enqueue_next(study, space, physical_cores=2, logical_cores=2)
        trial = study.ask()
        settings = space.suggest(trial)
        asked.append((trial.user_attrs.get(INFORMED_ATTR, False), settings.backend))
        study.tell(trial, [1.0, 1.0])
    assert asked[:2] == [(True, "llama_cpp"), (True, "transformers")]
    assert [informed for informed, _ in asked[2:]] == [False, False]
    first = study.trials[0].params
    assert first["quant"] == "Q8_0" and first["flash_attn"] is True and first["n_threads_batch"] == 2
    assert study.trials[1].params["dtype"] == "bfloat16"
