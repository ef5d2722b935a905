"""Machine profiles: what this machine is, a stable short id, and a human name."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from ..errors import AutotuneError
from ..util.paths import slug
from .. import backends

# CPU flags that change which llama.cpp / torch kernels run.
RELEVANT_FLAGS = ("sse3", "ssse3", "avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni", "avx512f",
                  "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_vbmi",
                  "amx_tile", "amx_int8", "amx_bf16", "neon", "asimd", "sve", "dotprod")
# Facts that identify the machine kind; host names and versions are left out on purpose so
# identical machines of a fleet share one profile.
FINGERPRINT_KEYS = ("cpu_model", "physical_cores", "logical_cores", "cpus", "cpu_flags",
                    "ram_gib", "gpu", "os", "arch")


@dataclass(frozen=True)
class MachineProfile:
    """A machine as autotune sees it: hardware facts, software versions, id and name."""

    name: str
    id: str
    cpu_model: str
    physical_cores: int
    logical_cores: int
    cpus: list[int]
    cpu_flags: list[str]
    ram_bytes: int
    ram_gib: int
    gpu: str
    os: str
    arch: str
    python: str
    llama_cpp_python: str
    llama_cpp_system_info: str
    torch: str
    hostname: str
    memory_bandwidth_gbs: float | None = None
    memory_bandwidth_all_gbs: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_cpus(self) -> int:
        """CPUs this process may use (its affinity)."""
        return len(self.cpus)

    def bandwidth_for(self, threads: int | None) -> float | None:
        """The memory bandwidth a decode on ``threads`` threads can draw on (see :func:`bandwidth_for_threads`)."""
        return bandwidth_for_threads(self.memory_bandwidth_gbs, self.memory_bandwidth_all_gbs, threads)

    def public(self) -> dict[str, Any]:
        """The profile as plain data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MachineProfile":
        """Rebuild a profile from :meth:`public` output, ignoring keys it does not know."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(("model name", "Hardware", "Processor")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    present = set(line.split(":", 1)[1].split())
                    return [f for f in RELEVANT_FLAGS if f in present]
    except OSError:
        pass
    return []


def _gpu() -> str:
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=10, check=False).stdout.strip()
            if out:
                return "; ".join(line.strip() for line in out.splitlines())
        except (OSError, subprocess.SubprocessError):
            pass
    return "none"


def _versions() -> tuple[str, str, str]:
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return ver("llama-cpp-python"), backends.system_info(), ver("torch")


def default_name(cpu_model: str, n_cpus: int, ram_gib: int, gpu: str) -> str:
    """A readable profile name from the hardware, e.g. ``amd-epyc-9r45-2cpu-23gib``."""
    words = [w for w in slug(cpu_model).split("-") if w not in
             ("processor", "cpu", "with", "radeon", "graphics", "core", "tm", "r", "64-core")]
    base = "-".join(words[:4]) or "cpu"
    name = f"{base}-{n_cpus}cpu-{ram_gib}gib"
    if gpu != "none":
        name += "-" + slug(gpu.split(",")[0])[:24]
    return name


def detect_profile(name: str | None = None, cpus: list[int] | None = None) -> MachineProfile:
    """Detect this machine's profile.

    ``cpus`` restricts the CPUs autotune (and every trial it starts) may use, as taskset
    would; the profile then records the smaller set and gets its own id.
    """
    if cpus is not None:
        try:
            os.sched_setaffinity(0, set(cpus))
        except (OSError, ValueError) as exc:
            raise AutotuneError(f"cannot restrict autotune to CPUs {cpus}: {exc}; "
                                f"this machine has CPUs 0-{os.cpu_count() - 1}") from None
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        list(range(os.cpu_count() or 1))
    ram = psutil.virtual_memory().total
    ram_gib = int(round(ram / 1024**3))
    cpu_model, gpu = _cpu_model(), _gpu()
    llama_ver, sysinfo, torch_ver = _versions()
    facts = {
        "cpu_model": cpu_model,
        "physical_cores": psutil.cpu_count(logical=False) or len(allowed),
        "logical_cores": psutil.cpu_count(logical=True) or len(allowed),
        "cpus": allowed,
        "cpu_flags": _cpu_flags(),
        "ram_gib": ram_gib,
        "gpu": gpu,
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
    }
    ident = hashlib.sha256(json.dumps({k: facts[k] for k in FINGERPRINT_KEYS},
                                      sort_keys=True).encode()).hexdigest()[:12]
    return MachineProfile(
        name=name or default_name(cpu_model, len(allowed), ram_gib, gpu),
        id=ident,
        ram_bytes=ram,
        python=sys.version.split()[0],
        llama_cpp_python=llama_ver,
        llama_cpp_system_info=sysinfo,
        torch=torch_ver,
        hostname=platform.node(),
        extra={"detected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        **facts,
    )


def bandwidth_for_threads(one_thread_gbs: float | None, all_cpus_gbs: float | None,
                          threads: int | None) -> float | None:
    """Bandwidth bound for ``threads`` readers: ``min(threads x one-thread, all-CPU)``.

    One core cannot saturate the memory bus, so a 1-thread decode is bound by the 1-thread figure
    and a many-thread decode by the all-CPU one; linear in between is the simple, documented model.
    Falls back to the 1-thread figure when the all-CPU one was not measured (older profiles).
    """
    if not one_thread_gbs:
        return None
    if not all_cpus_gbs or not threads or threads <= 1:
        return one_thread_gbs
    return round(min(threads * one_thread_gbs, max(all_cpus_gbs, one_thread_gbs)), 2)


def measure_memory_bandwidth(size_mb: int = 256, runs: int = 5, threads: int = 1) -> float:
    """Memory read bandwidth in GB/s: the best of ``runs`` numpy sums over a ``size_mb`` buffer.

    The buffer is far larger than any cache, so the sum streams from DRAM; the best run is the
    least disturbed by other work on a shared machine. One thread (the default, stored in the
    profile and used for every trial's decode efficiency) is what one core can pull: the bound
    of a single-threaded decode. With ``threads`` > 1 each thread sums its own slice at the same
    time (numpy releases the GIL in the sum), the bound a multi-threaded decode draws on; on a
    2-CPU EPYC VM it measured ~40% above the one-thread figure. The profile stores both
    (``memory_bandwidth_gbs``, ``memory_bandwidth_all_gbs``). Takes about a second.
    """
    import threading

    import numpy as np

    buf = np.ones(size_mb * 1024 * 1024 // 8, dtype=np.float64)  # writing the ones faults every page in
    buf.sum()  # one untimed pass first
    parts = np.array_split(buf, max(threads, 1))
    best = 0.0
    for _ in range(runs):
        workers = [threading.Thread(target=part.sum) for part in parts[1:]]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        parts[0].sum()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - start
        best = max(best, buf.nbytes / elapsed / 1e9)
    return round(best, 2)
