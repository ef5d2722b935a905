"""Quant types as a search dimension: names and a cache of quantized variants made from the source.

A variant is made once with llama.cpp's own quantizer in a child process (the quantizer can
abort() on bad input), written under a temporary name and renamed into
``cache_dir()/quants/<source sha256[:16]>/<stem>.<QUANT>.gguf``, with a ``.json`` sidecar next
to it. A failed quantization is remembered in the sidecar, so it is not retried on every run
with the same llama-cpp-python version. A file lock in the folder makes two processes asking
for the same variant at once quantize it only once.

Run as ``python -m tuner.backends.llama_cpp.quant SRC DST FTYPE NTHREAD`` it is that child. Ready-made quant
files (``--model-dir``) are found by :mod:`tuner.backends.llama_cpp.variants`.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import llama_cpp

from ...errors import AutotuneError
from ...util.files import VersionedFormat, remove_stale_temps, temp_sibling, write_json
from ...config.model import ModelInfo, sha256_of
from ...util.paths import cache_dir
from ...util.processes import module_command, run_command, signal_name, stderr_line
from ...measure.lock import file_lock

SOURCE = "source"
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
# Quantizer messages that mean the model itself is unusable, not just this target type.
MODEL_REFUSED = ("unknown model architecture", "model loader", "file bounds", "magic")
QUANTIZE_TIMEOUT_S = 3600
SIDECAR_VERSION = 1
# The ``.json`` next to a variant; a sidecar this version cannot read means the variant is made again.
SIDECAR = VersionedFormat("autotune-quant-sidecar", SIDECAR_VERSION, "autotune quant sidecar")

QUANT_TYPES: dict[str, int] = dict(sorted(
    [("F32", llama_cpp.LLAMA_FTYPE_ALL_F32)]
    + [(name.removeprefix("LLAMA_FTYPE_MOSTLY_"), getattr(llama_cpp, name))
       for name in dir(llama_cpp) if name.startswith("LLAMA_FTYPE_MOSTLY_")],
    key=lambda item: item[1]))


def check_quant_name(name: str) -> str:
    """``name`` normalized to upper case ("source" stays lower case); AutotuneError if unknown.

    Types that llama.cpp knows but cannot make from this model (IQ1/IQ2 and Q2_K_S need an
    importance matrix) pass here and come back from :func:`ensure_variant` with ``error`` set.
    """
    text = str(name).strip()
    if text.lower() == SOURCE:
        return SOURCE
    upper = text.upper()
    if upper not in QUANT_TYPES:
        raise AutotuneError(f"unknown quant type {name!r}: use 'source' or one of "
                            f"{', '.join(QUANT_TYPES)}")
    return upper


@dataclass(frozen=True)
class Variant:
    """One quantized form of the source model, usable when ``error`` is None."""

    quant: str
    path: str
    size_bytes: int
    sha256: str
    source_sha256: str
    source_file_type: str
    requantized: bool
    created_s: float
    cache_hit: bool
    error: str | None = None


def source_variant(model: ModelInfo) -> Variant:
    """The source file itself, as the ``source`` variant."""
    return Variant(quant=SOURCE, path=model.path, size_bytes=model.size_bytes, sha256=model.sha256,
                   source_sha256=model.sha256, source_file_type=model.file_type, requantized=False,
                   created_s=0.0, cache_hit=True)


def variant_path(model: ModelInfo, quant: str) -> Path:
    """Where the ``quant`` variant of ``model`` lives in the cache."""
    return cache_dir() / "quants" / model.sha256[:16] / f"{model.stem}.{quant}.gguf"


def _from_sidecar(sidecar: Path, dst: Path) -> Variant | None:
    """The cached variant, or None when it must be (re)made (a sidecar of another version too)."""
    try:
        meta = SIDECAR.check(json.loads(sidecar.read_text()), str(sidecar))
    except (OSError, ValueError, AutotuneError):
        return None
    if meta["error"] is not None:  # a failure is final for this llama.cpp version ...
        if meta.get("llama_cpp") != llama_cpp.__version__:
            return None
        if _crashed(meta["error"]) and meta.get("attempts", 1) < CRASHES_BEFORE_FINAL:
            return None  # ... but a crash must repeat before it is taken as the weight type's fault
    elif not dst.is_file() or dst.stat().st_size != meta["size_bytes"]:
        return None
    fields = {k: meta[k] for k in Variant.__dataclass_fields__ if k not in ("path", "cache_hit")}
    return Variant(**{**fields, "path": str(dst), "created_s": 0.0, "cache_hit": True})


CRASHES_BEFORE_FINAL = 2  # a quantizer crash is remembered as final once it happened this many times


def _crashed(error: str) -> bool:
    """Whether a quantization failure was a crash of the quantizer (a signal), not the engine refusing a type."""
    return error.startswith("quantizer crashed")


def _attempts_before(sidecar: Path) -> int:
    """How many times making this variant failed before, as its sidecar says (0 when it never failed)."""
    try:
        meta = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return 0
    if not isinstance(meta, dict) or not meta.get("error") or not _crashed(str(meta["error"])) \
            or meta.get("llama_cpp") != llama_cpp.__version__:  # only crashes of this llama.cpp version count
        return 0
    return int(meta.get("attempts", 1))


def _child_command(src: Path, dst: Path, ftype: int, nthread: int) -> list[str]:
    return module_command("tuner.backends.llama_cpp.quant", str(src), str(dst), str(ftype), str(nthread))


def _failure_reason(proc: subprocess.CompletedProcess) -> str:
    picked = stderr_line(proc.stderr, ("failed to quantize:", "GGML_ASSERT"))
    if "error" not in picked.lower() and "failed to quantize:" not in picked and "GGML_ASSERT" not in picked:
        picked = ""  # the last line of a quantizer's log says nothing about why it failed
    picked = picked.split("failed to quantize:", 1)[-1].strip()
    if signal_name(proc.returncode):
        return f"quantizer crashed ({signal_name(proc.returncode)})" + (f": {picked}" if picked else "")
    return picked or f"quantizer exited with status {proc.returncode}"


def _quantize(model: ModelInfo, quant: str, dst: Path, nthread: int) -> tuple[float, str | None]:
    """Run the quantizer child into a temporary file, then rename it; seconds taken and error."""
    remove_stale_temps(dst)  # left by a process killed mid-way (the caller holds the folder's lock)
    start = time.perf_counter()
    with temp_sibling(dst) as tmp:
        try:
            proc = run_command(_child_command(Path(model.path), tmp, QUANT_TYPES[quant], nthread), QUANTIZE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return time.perf_counter() - start, f"quantizer still running after {QUANTIZE_TIMEOUT_S}s"
        seconds = time.perf_counter() - start
        if proc.returncode == 0 and tmp.is_file():
            os.replace(tmp, dst)
            return seconds, None
        return seconds, _failure_reason(proc)


def ensure_variant(model: ModelInfo, quant: str, *, on_status: Callable[[str], None] | None = None,
                   nthread: int | None = None) -> Variant:
    """The ``quant`` variant of ``model``, made once and then taken from the cache.

    A quantization that fails or crashes gives a Variant with ``error`` set (and is remembered);
    a source file that changed since it was inspected, or that the quantizer cannot read at all
    (unknown architecture), raises AutotuneError. ``on_status`` gets short progress messages.
    """
    say = on_status or (lambda _text: None)
    quant = check_quant_name(quant)
    if quant == SOURCE:
        return source_variant(model)
    src = Path(model.path)
    if not src.is_file() or src.stat().st_size != model.size_bytes:
        raise AutotuneError(f"model file {src} changed or disappeared since it was inspected: run again")
    dst = variant_path(model, quant)
    sidecar = dst.with_suffix(".json")
    with file_lock(dst.parent / ".lock", lambda: say(f"waiting for another process quantizing to {quant}")):
        cached = _from_sidecar(sidecar, dst)
        if cached is not None:
            if cached.error:  # a variant made before is used silently; one that failed says so every time
                say(f"{quant}: failed before ({cached.error})")
            return cached
        failed_before = _attempts_before(sidecar)
        say(f"quantizing {src.name} to {quant} ...")
        threads = nthread or len(os.sched_getaffinity(0))
        seconds, error = _quantize(model, quant, dst, threads)
        if error and any(marker in error for marker in MODEL_REFUSED):
            raise AutotuneError(f"model file {src} cannot be quantized: {error}")
        if error is not None and transient(error, dst.parent):  # tried again next time, not remembered
            error = _with_cause(error, dst.parent)
            say(f"quantizing to {quant} ... failed: {error}; it is tried again next run")
            return Variant(quant=quant, path=str(dst), size_bytes=0, sha256="", source_sha256=model.sha256,
                           source_file_type=model.file_type, requantized=model.file_type not in FLOAT_TYPES,
                           created_s=round(seconds, 3), cache_hit=False, error=error)
        size = dst.stat().st_size if error is None else 0
        variant = Variant(quant=quant, path=str(dst), size_bytes=size,
                          sha256=sha256_of(dst) if error is None else "",
                          source_sha256=model.sha256, source_file_type=model.file_type,
                          requantized=model.file_type not in FLOAT_TYPES, created_s=round(seconds, 3),
                          cache_hit=False, error=error)
        meta = {k: v for k, v in asdict(variant).items() if k != "cache_hit"}
        write_json(sidecar, SIDECAR.stamp({**meta, "source_path": model.path, "llama_cpp": llama_cpp.__version__,
                                           "created_at": time.time(), "attempts": failed_before + 1 if error else 0}))
    say(f"quantizing to {quant} ... " + (f"failed: {error}" if error else
                                         f"done in {seconds:.1f}s ({size / 2**20:.1f} MiB)"))
    return variant


TRANSIENT_MARKS = ("no space left", "errno 28", "iostream error", "input/output error", "still running after",
                   "killed (sigkill)", "crashed (sigkill)", "crashed (sigterm)", "crashed (sigint)", "disk quota")
LOW_SPACE = 64 * 2**20  # free bytes under which a failed write is blamed on a full disk


def transient(error: str, folder: Path) -> bool:
    """Whether a quantization failure may not happen again (a full disk, an I/O error, a kill, a
    timeout): such a failure is not remembered. The engine refusing a type is final for this llama.cpp
    version at once; a crash of the quantizer itself once it repeated (``CRASHES_BEFORE_FINAL``)."""
    low = error.lower()
    return any(mark in low for mark in TRANSIENT_MARKS) or _free_bytes(folder) < LOW_SPACE


def _free_bytes(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


def _with_cause(error: str, folder: Path) -> str:
    """``error`` with its likely cause named where the disk is (nearly) full."""
    free = _free_bytes(folder)
    if free < LOW_SPACE or "no space left" in error.lower() or "errno 28" in error.lower():
        return f"no space left on the device holding {folder} ({free / 2**20:.0f} MiB free): {error}"
    return error


def _main(argv: list[str]) -> int:
    """Child entry: quantize ``argv[1]`` into ``argv[2]`` as ftype ``argv[3]`` on ``argv[4]`` threads."""
    src, dst, ftype, nthread = argv[1], argv[2], int(argv[3]), int(argv[4])
    if os.environ.get("AUTOTUNE_FAULT") == "quant-enospc":  # fault injection (tests): a full disk mid-write
        Path(dst).write_bytes(b"\0" * 1024)
        raise OSError(28, "No space left on device", dst)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = nthread
    return 0 if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) == 0 else 3


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
