"""Where llama.cpp put a model's weights: how many MiB went to an extra buffer type (repacked weights).

Repacking (``use_extra_bufts``, :mod:`tuner.backends.llama_cpp.engine`) moves the weights of the types a
CPU has a repacked kernel for into an extra buffer type (``CPU_REPACK``; ``AMX`` on Intel AMX CPUs) at
load time. For the others it does nothing: on an AVX2 EPYC, llama.cpp loads Q8_0 and Q6_K weights into the
plain ``CPU_Mapped`` buffer with repacking on ("cannot be used with preferred buffer type CPU_REPACK, using
CPU instead"), so a config with repacking off is the same program and measuring it is a trial spent for
nothing. llama.cpp says which buffers it made in its load log; a trial's child reads it
(:func:`capture`) and reports the MiB in extra buffer types (``repacked_mib``), and local refinement
does not flip repacking for a weight type that put nothing in one (:func:`same_program`, through
:meth:`tuner.backends.base.Backend.same_program` in :func:`tuner.search.refine.enqueue_refinement`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from typing import Any

# "load_tensors:   CPU_Mapped model buffer size =   136.40 MiB"
_BUFFER = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([0-9.]+) MiB")
PLAIN_BUFFERS = frozenset({"CPU", "CPU_Mapped"})  # where weights go without an extra buffer type


def extra_buffer_mib(log: str) -> float | None:
    """MiB of model weights a load log puts in extra buffer types (0.0: none), or None when the log names
    no model buffer at all (a llama.cpp whose log reads otherwise: nothing is known)."""
    found = _BUFFER.findall(log)
    if not found:
        return None
    return round(float(sum(float(mib) for name, mib in found if name not in PLAIN_BUFFERS)), 2)


@contextlib.contextmanager
def capture() -> Iterator[list[str]]:
    """While inside, llama.cpp's log lines are collected into the yielded list as well as handed to
    llama-cpp-python's own log callback (which prints them when ``verbose``). Call under the lock that
    guards llama.cpp's global settings (:data:`tuner.backends.llama_cpp.engine._PATCH_LOCK`)."""
    import ctypes

    import llama_cpp
    from llama_cpp import _logger

    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def collect(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        lines.append(text.decode("utf-8", "replace"))
        _logger.llama_log_callback(level, text, user_data)

    llama_cpp.llama_log_set(collect, ctypes.c_void_p(0))
    try:
        yield lines
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def unrepacked_types(records: Iterable[Any]) -> set[str]:
    """The weight types (``quant`` values) that measured trials loaded with repacking on and nothing in an
    extra buffer type: on this machine repacking does nothing for them."""
    return {str(r.settings.get("quant")) for r in records
            if r.settings.get("repack") and r.extra.get("repacked_mib") == 0.0}


def same_program(records: Iterable[Any], params: dict[str, Any]) -> dict[str, set[Any]]:
    """{"repack": the other value} where ``params``' weight type repacks nothing here (:func:`unrepacked_types`),
    so turning repacking the other way would measure the same program; else {}."""
    if "repack" in params and str(params.get("quant")) in unrepacked_types(records):
        return {"repack": {not params["repack"]}}
    return {}
