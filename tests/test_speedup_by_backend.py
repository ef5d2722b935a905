"""The recommendation states its speedup against every backend's measured defaults, not only its own."""

from __future__ import annotations

from test_confirm import study_of

from tuner.selection import decision, candidates as select
from tuner.recommend.summary import speedup_by_backend

LLAMA_BASE = {"n_threads": 1, "n_threads_batch": 2}
HF_BASE = {"backend": "transformers", "torch_threads": 2, "dtype": "float32"}
HF_BF16 = {"backend": "transformers", "torch_threads": 2, "dtype": "bfloat16"}


def test_the_pick_is_compared_with_both_engines_defaults() -> None:
    study = study_of([("baseline", LLAMA_BASE, [16.8, 16.9, 16.7], None),
                      ("baseline", HF_BASE, [7.9, 7.8, 8.0], None),
                      ("search", HF_BF16, [4.76, 4.8, 4.7], None)])
    cands = select.candidates(study)
    chosen = decision.best(cands, "request_time")
    assert chosen is not None and chosen.backend == "transformers"
    against = speedup_by_backend(cands, chosen)
    assert set(against) == {"llama_cpp", "transformers"}
    assert against["llama_cpp"]["request"] == round(16.8 / 4.76, 3)
    assert against["transformers"]["request"] == round(7.9 / 4.76, 3)
    assert against["llama_cpp"]["request"] > against["transformers"]["request"] > 1
    from rich.console import Console

    from tuner.recommend import document as recommend
    from tuner.cli.render import recommendation_table

    doc = recommend.build(profile={"name": "here"}, model={"name": "m", "path": "m.gguf"},
                          workload={"name": "default"}, objective="request_time", study="s", storage="sqlite://",
                          chosen=chosen, baseline=decision.baseline(cands, "transformers"),
                          extra={"speedup_by_backend": against})
    console = Console(record=True, width=200)
    console.print(recommendation_table(doc))
    text = console.export_text()
    assert f"llama_cpp prefill {against['llama_cpp']['prefill']:.2f}x" in text
    assert f"request {against['llama_cpp']['request']:.2f}x" in text
