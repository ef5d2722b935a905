"""A Hugging Face model folder (``config.json`` and ``*.safetensors`` weights) as a model to tune.

Its facts are read from the files themselves, without loading torch: the architecture and the
attention shapes from ``config.json`` (a multimodal config's ``text_config`` where the text model's
are kept), the parameter count, the weights' dtype and the tensor shapes from each safetensors
file's JSON header (8 bytes of little-endian length, then the header). The model's id is the
sha256 of the config and of every weights file (each cached by path, size and mtime), so the same
folder copied elsewhere is the same model, and a changed file is another.

Only backends that load such a folder tune it (:attr:`tuner.backends.base.Backend.model_formats`):
transformers does, llama.cpp needs a GGUF file.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import AutotuneError

FORMAT = "hf-folder"  # ModelInfo.format of a model folder (a GGUF file's is "gguf")
MAX_HEADER = 100 << 20  # a safetensors header larger than this is not one


def is_model_folder(path: Path) -> bool:
    """Whether ``path`` is a folder holding a ``config.json`` (a Hugging Face model folder)."""
    return path.is_dir() and (path / "config.json").is_file()


def safetensors_header(path: Path) -> dict[str, Any]:
    """The tensors of one safetensors file, {name: {dtype, shape, data_offsets}}; an AutotuneError naming the
    file when it is not one or is cut short."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        if not 2 <= length <= min(MAX_HEADER, size - 8):
            raise AutotuneError(f"model weights {path} are not a safetensors file: save the model again with "
                                "save_pretrained()")
        try:
            header = json.loads(fh.read(length))
        except ValueError:
            raise AutotuneError(f"model weights {path} have a corrupt safetensors header: save the model "
                                "again with save_pretrained()") from None
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = max((int(t["data_offsets"][1]) for t in tensors.values()), default=0)
    if 8 + length + end > size:
        raise AutotuneError(f"model weights {path} are truncated ({size} bytes, their tensors need "
                            f"{8 + length + end}): the download or copy did not finish")
    return tensors


def _config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise AutotuneError(f"model folder {path}: config.json cannot be read ({exc}): save the model again "
                            "with save_pretrained()") from None
    if not isinstance(config, dict):
        raise AutotuneError(f"model folder {path}: config.json is not a JSON object")
    return config


def folder_facts(path: Path, file_sha256: Callable[[Path], str]) -> dict[str, Any]:
    """The facts of the model folder ``path`` (the fields of :class:`tuner.config.model.ModelInfo`, which
    :func:`tuner.config.model.inspect_model` builds from them), each file hashed with ``file_sha256``; an
    AutotuneError that says what is missing or broken otherwise."""
    config = _config(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise AutotuneError(f"model folder {path} has no *.safetensors weights: save the model with "
                            "save_pretrained() (safetensors is its default), or pass a .gguf file")
    tensors: dict[str, Any] = {}
    for file in files:
        tensors.update(safetensors_header(file))
    counts = {name: math.prod(int(d) for d in t["shape"]) for name, t in tensors.items()}
    dtypes: Counter[str] = Counter()
    for name, t in tensors.items():
        dtypes[str(t["dtype"])] += counts[name]
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    n_embd = int(text.get("hidden_size") or 0)
    n_head = int(text.get("num_attention_heads") or 1)
    n_head_kv = int(text.get("num_key_value_heads") or n_head)
    head_dim = int(text.get("head_dim") or (n_embd // n_head if n_head else 0))
    digest = hashlib.sha256(json.dumps([(f.name, file_sha256(f)) for f in [path / "config.json", *files]]).encode())
    shapes = sorted((name, [int(d) for d in t["shape"]]) for name, t in tensors.items())
    return dict(
        path=str(path.resolve()),
        size_bytes=sum(f.stat().st_size for f in files),
        sha256=digest.hexdigest(),
        architecture=str(text.get("model_type") or config.get("model_type") or "unknown"),
        name=path.name,
        file_type=dtypes.most_common(1)[0][0] if dtypes else "unknown",
        n_layer=int(text.get("num_hidden_layers") or 0),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim,
        head_dim_v=head_dim,
        context_length=int(text.get("max_position_embeddings") or 0),
        n_params=sum(counts.values()),
        tensor_shapes_hash=hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16],
        format=FORMAT,
    )


def check_gguf_beside(folder: Any, gguf: Any) -> None:
    """Refuse ``gguf`` (a :class:`tuner.config.model.ModelInfo`) as the GGUF of the model folder ``folder``
    (``--gguf`` beside ``--model``) unless it is a GGUF file of the same model: same architecture, layers,
    width and parameter count (within 1%: a GGUF may store a tied embedding once, a folder twice)."""
    if folder.format != FORMAT:
        raise AutotuneError("--gguf goes with a Hugging Face model folder as --model (the GGUF of the same model, "
                            "for llama.cpp): give --model the folder, or leave --gguf out")
    if gguf.format != "gguf":
        raise AutotuneError(f"--gguf {gguf.path} is not a GGUF file: give the .gguf of the model in {folder.path}")
    same = (folder.architecture == gguf.architecture and folder.n_layer == gguf.n_layer
            and folder.n_embd == gguf.n_embd and abs(folder.n_params - gguf.n_params) <= 0.01 * max(folder.n_params, 1))
    if not same:
        raise AutotuneError(
            f"--gguf {gguf.path} is not the model in {folder.path}: {gguf.architecture}, {gguf.n_layer} layers, "
            f"width {gguf.n_embd}, {gguf.n_params} parameters against {folder.architecture}, {folder.n_layer}, "
            f"{folder.n_embd}, {folder.n_params}: give the GGUF converted from that folder")
