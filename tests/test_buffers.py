"""Which buffer llama.cpp put the weights in, read from its load log: repacking that does nothing is known."""

from __future__ import annotations

from pathlib import Path

from tuner.backends.llama_cpp import buffers
from tuner.backends.llama_cpp.engine import open_llama, repacked_mib

# llama.cpp's load log on an AVX2 EPYC: the bundled model made Q8_0 (no repacked kernel there), then Q4_0.
Q8_0_LOG = ("done_getting_tensors: tensor 'token_embd.weight' (q8_0) (and 272 others) cannot be used with preferred "
            "buffer type CPU_REPACK, using CPU instead\nload_tensors:   CPU_Mapped model buffer size =   136.40 MiB\n"
            "llama_kv_cache:        CPU KV buffer size =     5.62 MiB\n")
Q4_0_LOG = ("load_tensors:   CPU_Mapped model buffer size =    80.21 MiB\n"
            "load_tensors:   CPU_REPACK model buffer size =    56.95 MiB\n")


def test_the_load_log_tells_the_mib_in_extra_buffer_types() -> None:
    assert buffers.extra_buffer_mib(Q8_0_LOG) == 0.0
    assert buffers.extra_buffer_mib(Q4_0_LOG) == 56.95
    assert buffers.extra_buffer_mib("load_tensors:   AMX model buffer size =  30.00 MiB\n"
                                    "load_tensors:   CPU model buffer size =  10.00 MiB\n") == 30.0
    assert buffers.extra_buffer_mib("a log that names no model buffer") is None


def test_a_model_loaded_without_repacking_has_nothing_repacked(model_path: Path) -> None:
    # The real engine's log, read through the callback: parsed (not None) and nothing in an extra buffer.
    llm = open_llama({"model_path": str(model_path), "n_ctx": 256}, repack=False)
    try:
        assert repacked_mib(llm) == 0.0
    finally:
        llm.close()
