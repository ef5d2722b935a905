"""Building a ``llama_cpp.Llama`` with every setting autotune tunes, repacking included.

llama.cpp can place weights in "extra buffer types": CPU-specific layouts that it repacks the
weights into at load time (AMX tiles on Intel Sapphire/Granite Rapids, interleaved Q4_0/IQ4_NL
for AVX2/AVX-512/NEON). That is the model parameter ``use_extra_bufts`` (llama-bench
``--repack``, llama-server ``-nr/--no-repack``). It is a speed setting where it works, and on
some virtualized Xeons the AMX path segfaults on the first decode of quantized weights.

llama-cpp-python 0.3.36's ``Llama(...)`` has no keyword for it (unknown keywords are swallowed
by ``**kwargs``), so :func:`open_llama` sets it on the model parameters ``Llama`` builds from
``llama_model_default_params()``.

``AUTOTUNE_FAULT=repack-crash`` (tests) makes every model with quantized weights loaded with
repacking on die by a real SIGSEGV right after loading, as the AMX path does on such machines.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator
from typing import Any

from . import buffers

REPACK_CRASH_FAULT = "repack-crash"
# llama_ftype values whose weights are not quantized (all F32, mostly F16, mostly BF16).
UNQUANTIZED_FTYPES = (0, 1, 32)
_PATCH_LOCK = threading.RLock()  # llama.cpp's global settings: the default params patch, the log callback
REPACKED_ATTR = "_autotune_repacked_mib"


def simulated_repack_crash() -> bool:
    """Whether the fault-injection hook asks for the extra-buffer-type crash."""
    return REPACK_CRASH_FAULT in os.environ.get("AUTOTUNE_FAULT", "").split(",")


@contextlib.contextmanager
def repacking(repack: bool) -> Iterator[None]:
    """While inside, every ``llama_cpp.Llama`` built gets ``use_extra_bufts=repack`` (weight repacking,
    llama.cpp's extra buffer types). llama-cpp-python has no keyword for it, so with ``repack`` false
    its ``llama_model_default_params`` is patched, under a lock, for this block alone; with ``repack``
    true nothing changes (the engine's default). The one place that patch lives."""
    if repack:
        yield
        return
    import llama_cpp.llama_cpp as lib

    original = lib.llama_model_default_params

    def without_extra_bufts() -> Any:
        params = original()
        params.use_extra_bufts = False
        return params

    with _PATCH_LOCK:  # the patch is visible to other threads only while this block runs
        lib.llama_model_default_params = without_extra_bufts
        try:
            yield
        finally:
            lib.llama_model_default_params = original


def open_llama(kwargs: dict[str, Any], repack: bool = True) -> Any:
    """``llama_cpp.Llama(**kwargs)`` with ``use_extra_bufts`` set to ``repack`` (:func:`repacking`).

    With ``repack`` true this is exactly what ``Llama(**kwargs)`` does (the engine's default). The load
    log is read for the MiB of weights in extra buffer types (:func:`repacked_mib`).
    """
    import llama_cpp

    with _PATCH_LOCK, buffers.capture() as log, repacking(repack):
        llm = llama_cpp.Llama(**{"verbose": False, **kwargs})
    setattr(llm, REPACKED_ATTR, buffers.extra_buffer_mib("".join(log)))
    if repack and simulated_repack_crash() and weights_quantized(llm):
        ctypes.string_at(0)  # a real SIGSEGV, as llama.cpp's AMX path gives on its first decode
    return llm


def repacked_mib(llm: Any) -> float | None:
    """MiB of ``llm``'s weights llama.cpp put in extra buffer types when :func:`open_llama` loaded it (0.0:
    repacking changed nothing for these weights on this CPU), None where its load log did not say."""
    return getattr(llm, REPACKED_ATTR, None)


def weights_quantized(llm: Any) -> bool:
    """Whether the loaded model's weights are a quantized type (not F32, F16 or BF16)."""
    ftype = llm.metadata.get("general.file_type")
    return ftype is not None and int(ftype) not in UNQUANTIZED_FTYPES


def uses_extra_bufts(llm: Any) -> bool:
    """The ``use_extra_bufts`` model parameter a ``Llama`` was built with."""
    return bool(llm.model_params.use_extra_bufts)


def system_info() -> str:
    """llama.cpp's build and CPU features line (``llama_print_system_info``); "unavailable: ..." when the
    library cannot load (a broken build is a fact worth recording, not an error)."""
    try:
        import llama_cpp

        return llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    except Exception as exc:  # noqa: BLE001 - a broken build is a fact worth recording
        return f"unavailable: {exc}"
