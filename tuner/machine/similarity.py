"""How alike two machine profiles are, so a new machine can start from what a similar one measured.

``similarity(a, b)`` is a number in [0, 1], a weighted sum of four facts that decide which llama.cpp
and torch kernels run and how fast: the CPU vendor and family (0.35: same vendor and family words,
e.g. "AMD EPYC"), the instruction-set flags that matter to the kernels (0.25: Jaccard overlap of
AVX2, AVX-512, VNNI, AMX, ...), the CPU count (0.2: smaller over larger) and the measured memory
bandwidth (0.2: smaller over larger; half credit when either was never measured). Different
architectures (x86_64 against aarch64) are 0: nothing carries over. Thread counts of a borrowed
config are scaled to this machine's CPUs by :func:`scale_threads`.
"""

from __future__ import annotations

import re
from typing import Any

from .profile import MachineProfile

WEIGHTS = {"family": 0.35, "flags": 0.25, "cpus": 0.2, "bandwidth": 0.2}
THREAD_SETTINGS = ("n_threads", "n_threads_batch", "torch_threads")
_NOISE = {"r", "tm", "cpu", "processor", "with", "core", "gen"}


def cpu_family(cpu_model: str) -> tuple[str, ...]:
    """The vendor and family words of a CPU model name, e.g. ("amd", "epyc") or ("intel", "xeon")."""
    words = [w for w in re.split(r"[^a-z0-9]+", cpu_model.lower()) if w and w not in _NOISE]
    words = ["intel" if w.startswith("intel") else w for w in words]
    return tuple(w for w in words if not any(c.isdigit() for c in w))[:2]


def _ratio(a: float | None, b: float | None) -> float:
    if not a or not b:
        return 0.5
    return min(a, b) / max(a, b)


def similarity(a: MachineProfile, b: MachineProfile) -> float:
    """How alike ``a`` and ``b`` are, from 0 (nothing carries over) to 1 (the same machine kind)."""
    if a.arch != b.arch:
        return 0.0
    fa, fb = set(a.cpu_flags), set(b.cpu_flags)
    parts = {
        "family": 1.0 if cpu_family(a.cpu_model) == cpu_family(b.cpu_model) else 0.0,
        "flags": len(fa & fb) / len(fa | fb) if fa | fb else 1.0,
        "cpus": _ratio(a.n_cpus, b.n_cpus),
        "bandwidth": _ratio(a.memory_bandwidth_gbs, b.memory_bandwidth_gbs),
    }
    return round(sum(WEIGHTS[k] * v for k, v in parts.items()), 4)


def scale_threads(settings: dict[str, Any], from_cpus: int, to_cpus: int) -> dict[str, Any]:
    """``settings`` with thread counts scaled from a machine of ``from_cpus`` CPUs to ``to_cpus``."""
    out = dict(settings)
    for key in THREAD_SETTINGS:
        if isinstance(out.get(key), int):
            out[key] = max(1, min(to_cpus, round(out[key] * to_cpus / max(from_cpus, 1))))
    return out
