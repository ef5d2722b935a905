"""A model and its tokenizer loaded with transformers: a Hugging Face folder, or a GGUF file dequantized.

Dequantizing a GGUF file takes most of a transformers trial's setup (SmolLM2-135M on a 2-vCPU EPYC: 17-20 s of
a ~50 s trial, every trial). The first trial that dequantizes a file in a dtype saves the result as a model
folder in the cache (``keep``, :func:`dequantized_folder`: safetensors, the very same tensors and config), and later
trials load that folder (0.3 s; the same logits, checked bit for bit). ``load_s`` is then the folder's load
time; the trial that made the copy reports the seconds it took as ``once_s`` (a cost no later trial of the
file repeats, so the confirmation stage does not price its re-measures with it). A copy is not kept where it would take more than ``MAX_DISK_SHARE`` of the free disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...util.files import TEMP_MARK
from ...util.paths import cache_dir
from ...util.processes import alive

if TYPE_CHECKING:  # cycle break: the settings model loads this package first
    from ..settings_model import TrialSettings

MAX_DISK_SHARE = 0.25  # a dequantized copy is kept only where it takes at most this share of the free disk
BYTES_PER_DTYPE = {"float32": 4, "bfloat16": 2, "float16": 2}


def dequantized_folder(gguf: Path, dtype: str) -> Path:
    """Where the dequantized copy of ``gguf`` in ``dtype`` is kept: keyed by the file's resolved path, size and
    modification time (a changed file gets a new copy)."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / "transformers-dequantized" / f"{gguf.stem}-{key}-{dtype}"


def kept(model_path: str, dtype: str) -> bool:
    """Whether the GGUF file ``model_path`` has a dequantized copy in ``dtype`` kept (a folder: never)."""
    path = Path(model_path)
    return path.is_file() and (dequantized_folder(path, dtype) / "config.json").is_file()


def load(model_path: str, settings: TrialSettings, keep: bool = False) -> tuple[Any, Any, float]:
    """Tokenizer and model for ``model_path`` (a GGUF file or a model folder), and the load seconds; a GGUF
    file's dequantized copy is loaded where one is kept, and made where ``keep`` (a trial's child) asks."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(model_path)
    start = time.perf_counter()
    if path.is_dir():
        return (*_load(path, settings, {}), time.perf_counter() - start)
    copy = dequantized_folder(path, settings.dtype)
    if (copy / "config.json").is_file():
        with contextlib.suppress(Exception):  # a copy that cannot be read is made again from the file
            return (*_load(copy, settings, {}), time.perf_counter() - start)
    from transformers import GgufConfig

    # Dense weights in the asked dtype, said explicitly: for some architectures transformers
    # could otherwise keep the GGUF blocks packed (and warns about dtype even when it does not).
    model, tokenizer = _load(path.parent, settings, {"gguf_file": path.name,
                                                     "quantization_config": GgufConfig(dequantize=True)})
    seconds = time.perf_counter() - start
    if keep:
        _keep(model, tokenizer, copy, settings.dtype)
    return model, tokenizer, seconds


def _load(where: Path, settings: TrialSettings, extra: dict[str, Any]) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(where, **{k: v for k, v in extra.items() if k == "gguf_file"})
    model = AutoModelForCausalLM.from_pretrained(
        where, dtype=getattr(torch, settings.dtype), attn_implementation=settings.attn_implementation, **extra)
    model.eval()
    return model, tokenizer


def _keep(model: Any, tokenizer: Any, folder: Path, dtype: str) -> None:
    """Save the dequantized ``model`` and its ``tokenizer`` as ``folder``, whole or not at all (a temporary
    folder renamed), where the disk has room; a failure only means the next trial dequantizes again."""
    size = sum(p.numel() for p in model.parameters()) * BYTES_PER_DTYPE.get(dtype, 4)
    parent = folder.parent
    tmp = parent / f".{folder.name}{TEMP_MARK}{os.getpid()}"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if size > MAX_DISK_SHARE * shutil.disk_usage(parent).free:
            return
        for stale in parent.glob(f".*{TEMP_MARK}*"):  # left by a trial killed while saving
            pid = stale.name.rsplit(TEMP_MARK, 1)[-1]
            if pid.isdigit() and not alive(int(pid)):
                shutil.rmtree(stale, ignore_errors=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.replace(folder)  # another trial's copy already there: this one is dropped
    except Exception:  # noqa: BLE001 - no copy only means the next trial dequantizes again
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
