"""Ready-made quant files (``--model-dir``): other quant types of the source model, found in a folder.

Each file is checked to be the same model as the source (architecture, tensor names and shapes)
and becomes a :class:`tuner.backends.llama_cpp.quant.Variant` keyed by its quant type, used instead of making one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ...errors import AutotuneError
from .gguf import tensor_shape_signature
from ...config.model import ModelInfo, inspect_model
from .quant import QUANT_TYPES, Variant


def find_variants(model_dir_or_files: str | os.PathLike | Iterable[str | os.PathLike],
                  source: ModelInfo) -> dict[str, Variant]:
    """Ready-made quant files of ``source`` (a folder of ``.gguf`` files, or a list), keyed by type.

    Every file must be the same model as ``source`` (architecture and tensor names and shapes);
    a file of another model, two files of one type, or an unreadable file raise AutotuneError
    naming the file. The source file itself, if present, is skipped.
    """
    given = model_dir_or_files
    if isinstance(given, (str, os.PathLike)):
        root = Path(given).expanduser()
        files = sorted(root.glob("*.gguf")) if root.is_dir() else [root]
        if not files:
            raise AutotuneError(f"no .gguf files in {root}: pass the folder holding the quant files")
    else:
        files = [Path(p).expanduser() for p in given]
    want = tensor_shape_signature(source.path)
    found: dict[str, Variant] = {}
    for file in files:
        if file.resolve() == Path(source.path).resolve():
            continue
        info = inspect_model(file)
        if info.sha256 == source.sha256:
            continue
        why = (f"a {info.architecture} model, not {source.architecture}"
               if info.architecture != source.architecture else
               "other tensor names or shapes" if tensor_shape_signature(info.path) != want else "")
        if why:
            raise AutotuneError(f"model file {file} is not the same model as {source.path} ({why}): "
                                "remove it from the list")
        key = info.file_type.upper() if info.file_type.upper() in QUANT_TYPES else info.stem
        if key in found:
            raise AutotuneError(f"model files {found[key].path} and {file} are both {key}: keep one")
        found[key] = Variant(quant=key, path=info.path, size_bytes=info.size_bytes, sha256=info.sha256,
                             source_sha256=source.sha256, source_file_type=source.file_type,
                             requantized=False, created_s=0.0, cache_hit=True)
    return found
