"""Quant variants and the quality guard, with the real quantizer and the real bundled model.

Quantization and perplexity run once per module in a module-owned cache folder; perplexity
uses one 512-token window on one thread to keep the module fast on a busy 2-core machine.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tuner.backends.llama_cpp import quant
from tuner.errors import AutotuneError
from tuner.backends.llama_cpp.gguf import tensor_shape_signature, tensor_shapes
from tuner.config.model import ModelInfo, bundled_model_path, inspect_model
from tuner.backends.llama_cpp.quality import Quality, is_measured, measure_quality, quality_ok
from tuner.config.quality import parse_max_loss
from tuner.backends.llama_cpp.quant import QUANT_TYPES, check_quant_name, ensure_variant, source_variant
from tuner.backends.llama_cpp.variants import find_variants

# the module fixtures are built once, on one worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("quant")]
MADE = ("Q8_0", "Q3_K_S")
PPL = dict(max_tokens=512, n_threads=1)


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's own variant cache, so other modules' variants never make a hit here."""
    return tmp_path_factory.mktemp("quant-cache")


@pytest.fixture(autouse=True)
def _use_module_cache(hermetic: Path, module_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(module_cache))


@pytest.fixture(scope="module")
def source(module_cache: Path) -> ModelInfo:
    """The bundled Q4_1 model."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOTUNE_CACHE_DIR", str(module_cache))
        return inspect_model(bundled_model_path())


@pytest.fixture(scope="module")
def made(source: ModelInfo, module_cache: Path) -> dict[str, tuple[quant.Variant, list[str]]]:
    """Each type in MADE quantized once, with the status messages it produced."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOTUNE_CACHE_DIR", str(module_cache))
        for name in MADE:
            said: list[str] = []
            out[name] = (ensure_variant(source, name, on_status=said.append), said)
    return out


@pytest.fixture(scope="module")
def qualities(source: ModelInfo, made, module_cache: Path) -> dict[str, Quality]:
    """Perplexity of the source and of each made variant."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOTUNE_CACHE_DIR", str(module_cache))
        out = {"source": measure_quality(source_variant(source), source, **PPL)}
        out.update({name: measure_quality(v, source, **PPL) for name, (v, _) in made.items()})
    return out


def test_quant_names_come_from_llama_cpp():
    assert QUANT_TYPES["F32"] == 0 and QUANT_TYPES["F16"] == 1 and QUANT_TYPES["Q4_0"] == 2
    assert {"Q8_0", "Q4_K_M", "Q3_K_M", "Q2_K", "BF16", "Q6_K"} <= set(QUANT_TYPES)
    assert check_quant_name("q4_k_m") == "Q4_K_M"
    assert check_quant_name(" Source ") == "source"
    with pytest.raises(AutotuneError, match=r"unknown quant type 'Q9_9'.*Q4_0.*Q8_0"):
        check_quant_name("Q9_9")
    assert check_quant_name("iq2_xxs") == "IQ2_XXS"


def test_variants_are_made_and_requantized(made, source: ModelInfo, module_cache: Path):
    for name, (variant, said) in made.items():
        path = Path(variant.path)
        assert variant.error is None and variant.quant == name
        assert path == module_cache / "quants" / source.sha256[:16] / f"{source.stem}.{name}.gguf"
        assert path.is_file() and path.stat().st_size == variant.size_bytes
        assert path.with_suffix(".json").is_file()
        assert variant.requantized and variant.source_file_type == "Q4_1"
        assert not variant.cache_hit and variant.created_s > 0
        assert said[0].startswith(f"quantizing {Path(source.path).name} to {name}") and "done in" in said[-1]
    assert not list(Path(made["Q8_0"][0].path).parent.glob(".*tmp*"))


def test_second_request_is_a_cache_hit(made, source: ModelInfo):
    first = made["Q8_0"][0]
    mtime = Path(first.path).stat().st_mtime_ns
    again = ensure_variant(source, "q8_0")
    assert again.cache_hit and again.created_s == 0.0 and again.error is None
    assert (again.path, again.sha256, again.size_bytes) == (first.path, first.sha256, first.size_bytes)
    assert Path(again.path).stat().st_mtime_ns == mtime


def test_sidecar_of_another_version_means_remaking(made, tmp_path: Path):
    variant_file = Path(made["Q8_0"][0].path)
    meta = json.loads(variant_file.with_suffix(".json").read_text())
    assert meta["format"] == "autotune-quant-sidecar" and meta["version"] == quant.SIDECAR_VERSION
    copy = tmp_path / "sidecar.json"
    gone = object()  # the key left out
    for changed, usable in (({}, True), ({"format": gone}, True), ({"version": 99}, False),
                            ({"version": gone}, False), ({"format": "other"}, False)):
        doc = {k: v for k, v in {**meta, **changed}.items() if v is not gone}
        copy.write_text(json.dumps(doc))
        assert (quant._from_sidecar(copy, variant_file) is not None) is usable, changed


def test_source_is_the_given_file(source: ModelInfo):
    variant = ensure_variant(source, "source")
    assert variant.path == source.path and not variant.requantized and variant.error is None


def test_two_requests_at_once_quantize_once(source: ModelInfo):
    barrier, got = threading.Barrier(2), []

    def ask() -> None:
        barrier.wait()
        got.append(ensure_variant(source, "Q4_0"))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(v.cache_hit for v in got) == [False, True]
    assert got[0].path == got[1].path and got[0].sha256 == got[1].sha256


def test_perplexity_is_finite_and_ordered(qualities: dict[str, Quality]):
    src, q8, q3 = qualities["source"], qualities["Q8_0"], qualities["Q3_K_S"]
    for q in qualities.values():
        assert q.error is None and math.isfinite(q.perplexity) and q.perplexity > 1
        assert q.tokens > 400 and q.reference_perplexity == src.perplexity
    assert src.loss == 0.0
    assert abs(q8.loss) < 0.03
    assert q3.perplexity > q8.perplexity and q3.loss > 0.05


def test_quality_is_measured_once(qualities: dict[str, Quality], made, source: ModelInfo):
    assert is_measured(made["Q8_0"][0], source, max_tokens=PPL["max_tokens"])  # a progress line only when not
    again = measure_quality(made["Q8_0"][0], source, **PPL)
    assert again.cached and again.perplexity == qualities["Q8_0"].perplexity
    assert not is_measured(made["Q8_0"][0], source, max_tokens=PPL["max_tokens"] + 1)


def test_quality_guard_excludes_a_lossy_variant(qualities: dict[str, Quality]):
    assert quality_ok(qualities["Q8_0"], parse_max_loss("5%"))
    assert not quality_ok(qualities["Q3_K_S"], parse_max_loss("5%"))
    assert not quality_ok(Quality(math.nan, 30.0, math.nan, 0, 0.0, error="boom"), 0.5)


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.05", 0.05), (" 2.5 % ", 0.025), ("0", 0.0)])
def test_parse_max_loss(text: str, value: float):
    assert parse_max_loss(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "-5%", "5", "5%%", ""])
def test_parse_max_loss_refuses_garbage(text: str):
    with pytest.raises(AutotuneError, match="max-quality-loss"):
        parse_max_loss(text)


def test_bad_model_files_are_named(tmp_path: Path, source: ModelInfo):
    text = tmp_path / "notes.gguf"
    text.write_text("just some text, not a model\n")
    with pytest.raises(AutotuneError, match=r"notes\.gguf.*not a GGUF"):
        inspect_model(text)
    truncated = tmp_path / "half.gguf"
    truncated.write_bytes(Path(source.path).read_bytes()[: source.size_bytes // 2])
    with pytest.raises(AutotuneError, match=r"half\.gguf.*(truncated|corrupt)"):
        inspect_model(truncated)
    with pytest.raises(AutotuneError, match="unknown quant type"):
        ensure_variant(source, "Q9_9")


def test_architecture_the_quantizer_refuses(tmp_path: Path):
    data = bundled_model_path().read_bytes()
    at = data.index(b"llama", data.index(b"general.architecture"))
    odd = tmp_path / "odd-arch.gguf"
    odd.write_bytes(data[:at] + b"xxxxx" + data[at + 5:])
    with pytest.raises(AutotuneError, match=r"odd-arch\.gguf.*unknown model architecture"):
        ensure_variant(inspect_model(odd), "Q8_0")


def test_crashed_quantization_marks_only_that_variant(source: ModelInfo, monkeypatch: pytest.MonkeyPatch):
    real = quant._child_command
    monkeypatch.setattr(quant, "_child_command", lambda *a: [sys.executable, "-c", "import os; os.abort()"])
    variant = ensure_variant(source, "Q5_0")
    assert variant.error and "SIGABRT" in variant.error and not variant.cache_hit
    assert not Path(variant.path).exists()
    twice = ensure_variant(source, "Q5_0")   # a crash is tried once more before it is the type's fault
    assert twice.error and not twice.cache_hit
    monkeypatch.setattr(quant, "_child_command", real)  # it would work now, but the repeated crash is remembered
    again = ensure_variant(source, "Q5_0")
    assert again.cache_hit and again.error == variant.error
    quality = measure_quality(again, source, **PPL)
    assert quality.error and not quality_ok(quality, 1.0)


def test_a_crash_that_does_not_repeat_is_not_remembered(source: ModelInfo, monkeypatch: pytest.MonkeyPatch):
    real = quant._child_command
    monkeypatch.setattr(quant, "_child_command", lambda *a: [sys.executable, "-c", "import os; os.abort()"])
    assert ensure_variant(source, "Q5_1").error
    monkeypatch.setattr(quant, "_child_command", real)
    made = ensure_variant(source, "Q5_1")      # the next try runs the quantizer again, and it works
    assert made.error is None and not made.cache_hit and Path(made.path).is_file()


def test_a_variant_that_cannot_be_evaluated_fails_the_guard(tmp_path: Path, source: ModelInfo):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(64))
    variant = quant.Variant("Q8_0", str(broken), 68, "0" * 64, source.sha256, "Q4_1", True, 0.0, True)
    quality = measure_quality(variant, source, **PPL)
    assert quality.error and "broken.gguf" in quality.error and not quality_ok(quality, 1.0)


def test_quantizer_refusing_a_type_is_an_error_not_an_exception(source: ModelInfo):
    variant = ensure_variant(source, "IQ2_XXS")  # llama.cpp wants an importance matrix for it
    assert variant.error and "imatrix" in variant.error and not Path(variant.path).exists()


def test_tensor_shapes_are_read_from_the_gguf_header(tmp_path: Path, made, source: ModelInfo):
    shapes = tensor_shapes(source.path)
    assert len(shapes) > 10 and ("token_embd.weight", [576, 49152]) in shapes
    assert tensor_shape_signature(made["Q8_0"][0].path) == tensor_shape_signature(source.path)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(Path(source.path).read_bytes()[:4096])
    with pytest.raises(AutotuneError, match="cut.gguf has an unreadable GGUF tensor table"):
        tensor_shape_signature(str(cut))


def test_find_variants_of_the_same_model(tmp_path: Path, made, source: ModelInfo):
    folder = tmp_path / "quants"
    folder.mkdir()
    (folder / "mine-Q8_0.gguf").symlink_to(made["Q8_0"][0].path)
    (folder / "original.gguf").symlink_to(source.path)
    found = find_variants(folder, source)
    assert set(found) == {"Q8_0"}
    assert found["Q8_0"].sha256 == made["Q8_0"][0].sha256 and found["Q8_0"].error is None
    with pytest.raises(AutotuneError, match="both Q8_0"):
        find_variants([folder / "mine-Q8_0.gguf", made["Q8_0"][0].path], source)


def test_find_variants_refuses_another_model(tmp_path: Path, made, source: ModelInfo):
    import gguf

    other = tmp_path / "other-model.gguf"
    writer = gguf.GGUFWriter(str(other), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 16), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(AutotuneError, match=r"other-model\.gguf is not the same model"):
        find_variants([made["Q3_K_S"][0].path, other], source)


def test_the_gguf_file_type_table_agrees_with_llama_cpps_own() -> None:
    # autotune names a GGUF's general.file_type from its own copy of llama.h's llama_ftype (the config layer
    # does not load the engine); every type the installed llama.cpp knows is named alike there.
    import llama_cpp

    from tuner.config.model import FILE_TYPES, _file_type_name

    known = {getattr(llama_cpp, n): n for n in dir(llama_cpp) if n.startswith("LLAMA_FTYPE_")}
    assert known
    for value, name in known.items():
        if value in FILE_TYPES:
            assert name.endswith(FILE_TYPES[value]), (value, name, FILE_TYPES[value])
    assert {llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1, llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0} <= set(FILE_TYPES)
    assert _file_type_name(999) == "type999" and _file_type_name(None) == "unknown"
