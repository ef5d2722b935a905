"""Roofline: how close decode (and prefill) come to what the memory and the cores can physically do.

Decode of one token reads every weight once plus the KV cache up to the current position, so
``decode tokens/s x bytes per token`` is the memory traffic it implies; divided by the
measured read bandwidth it is the decode efficiency that every llama.cpp trial stores
(``extra.decode_efficiency``, computed here by the same function, ``tuner.search.trial``).

Bandwidth is measured two ways, each the best of several runs over 256 MB (far beyond the
caches) by ``tuner.machine.profile.measure_memory_bandwidth``: with one thread and with all CPUs at
once (one numpy sum per thread over its own slice); the profile stores both. A decode on k
threads is held against ``min(k x one-thread, all-CPU)`` (``tuner.machine.profile.bandwidth_for_threads``),
the same bound the trials and the recommendation file use.

Prefill is compute-bound: it does about ``2 x parameters`` FLOPs per token plus attention
(``4 x layers x heads x head_dim x mean position``). llama.cpp's CPU kernels for quantized
weights multiply int8 (activations are quantized to 8 bits, AVX-512 VNNI dot products), so
the honest ceiling is an int8 GEMM peak, measured here with ``torch._int_mm`` (oneDNN) on all
CPUs; the float32 GEMM peak is printed too. Both are best-of-5 2048x2048 products: a real
ceiling of this machine's matrix units, though llama.cpp's own kernels could not reach it
even in theory for small per-layer matrices (576 wide for SmolLM2-135M).

Usage: ``python benchmarks/roofline.py [--quick] [--recommendation FILE] [--rounds 2]``
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402

from tuner.backends.llama_cpp.backend import LlamaCpp  # noqa: E402
from tuner.backends import DEFAULT as DEFAULT_BACKEND  # noqa: E402
from tuner.machine.profile import bandwidth_for_threads, measure_memory_bandwidth  # noqa: E402
from tuner.recommend.document import load as load_recommendation  # noqa: E402
from tuner.backends.settings import TrialSettings  # noqa: E402
from tuner.measure.records import TrialResult  # noqa: E402
from tuner.search.trial import decode_efficiency  # noqa: E402
from tuner.config.workloads import get_workload  # noqa: E402

FLOAT_TYPES = ("F32", "F16", "BF16")


def gemm_peaks(n: int = 2048, runs: int = 5) -> dict[str, float]:
    """Best-of-``runs`` GFLOP/s of an n x n float32 and int8 matrix product on all CPUs (torch)."""
    try:
        import torch
    except ImportError:
        return {}
    out = {}
    for name, make, mul in (("fp32", lambda: torch.randn(n, n), torch.matmul),
                            ("int8", lambda: torch.randint(-127, 127, (n, n), dtype=torch.int8), torch._int_mm)):
        try:
            a, b = make(), make()
            mul(a, b)  # warm-up: kernel selection and page faults
            best = 0.0
            for _ in range(runs):
                start = time.perf_counter()
                mul(a, b)
                best = max(best, 2 * n**3 / (time.perf_counter() - start) / 1e9)
            out[name] = round(best, 1)
        except (RuntimeError, AttributeError):  # no int8 GEMM on this torch build
            continue
    return out


def prefill_flops_per_token(model: Any, prompt_tokens: int) -> float:
    """FLOPs per prompt token: the weight matmuls plus attention at the mean position of the prompt."""
    attention = 4 * model.n_layer * model.n_head * model.head_dim_k * prompt_tokens / 2
    return 2 * model.n_params + attention


def configs_to_measure(n_cpus: int, quick: bool, recommendation: Path | None,
                       needed_ctx: int) -> dict[str, TrialSettings]:
    """Weight types x thread counts (flash attention on, f16 KV cache), and the recommendation."""
    quants = ["source"] + (["Q4_0", "Q8_0"] if C.variants_ready() and not quick else [])
    n_ctx = max(512, -(-needed_ctx // 256) * 256)
    out = {f"{q} t={t}": TrialSettings(quant=q, n_threads=t, n_threads_batch=t, flash_attn=True, n_ctx=n_ctx)
           for q in quants for t in sorted({1, n_cpus})}
    if recommendation and recommendation.is_file():
        doc = load_recommendation(recommendation)
        if doc["settings"].get("backend", DEFAULT_BACKEND) == LlamaCpp.name:
            out["recommended"] = TrialSettings(**doc["settings"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__)
    p.add_argument("--recommendation", type=Path,
                   help="recommendation to include (default: <cache-dir>/speedup-recommendation.yaml if present)")
    p.add_argument("--rounds", type=int, help="alternating rounds per config (default 2; --quick: 1)")
    p.add_argument("--repetitions", type=int, help="timed repetitions per trial (default 3; --quick: 2)")
    p.add_argument("--workload", help="workload (default: default; --quick: tiny)")
    a = p.parse_args(argv)
    rounds = a.rounds or (1 if a.quick else 2)
    reps = a.repetitions or (2 if a.quick else 3)
    workload = get_workload(a.workload or ("tiny" if a.quick else "default"))
    machine = C.Machine.detect()
    n_cpus = machine.profile.n_cpus
    rec = a.recommendation or (a.cache_dir / "speedup-recommendation.yaml")
    configs = configs_to_measure(n_cpus, a.quick, rec, workload.needed_ctx())
    C.header("roofline", machine, workload=f"{workload.name} ({workload.prompt_tokens} prompt / "
             f"{workload.generate_tokens} generated tokens), {rounds} round(s) x {reps} repetitions per config",
             recommendation=rec if "recommended" in configs else "none found (run speedup.py first)")

    bw1 = measure_memory_bandwidth()
    bwn = measure_memory_bandwidth(threads=n_cpus)
    peaks = gemm_peaks()
    print(f"memory bandwidth (1 thread): {bw1:.2f} GB/s; ({n_cpus} threads): {bwn:.2f} GB/s  [best of 5, 256 MB]")
    print("compute peak (torch GEMM, all CPUs): " +
          (", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items()) or "n/a (torch not installed)"))

    out = C.interleave(machine.model, configs, workload, rounds, reps)
    for name, outcomes in out.items():
        ok = [o for o in outcomes if o.ok]
        if not ok:
            print(f"{name}: failed ({outcomes[0].status}: {outcomes[0].reason})")
            continue
        settings = configs[name]
        _, size = C.model_path_for(machine.model, settings)
        result = {**ok[0].result, "decode_tps": C.samples(ok, "decode_tps")}
        bound = bandwidth_for_threads(bw1, bwn, settings.n_threads)
        eff = decode_efficiency(machine.model, bound, settings, size, TrialResult.read(result))
        decode = C.median(result["decode_tps"])
        per_token = eff["decode_bytes_per_token"]
        gbs = decode * per_token / 1e9
        print(f"{name}: decode {C.spread(result['decode_tps'], ' t/s', 1)} x {per_token / 1e6:.1f} MB/token "
              f"= {gbs:.2f} GB/s; efficiency {eff['decode_efficiency']:.0%} of the {bound:.2f} GB/s "
              f"a {settings.n_threads}-thread decode can draw ({gbs / bw1:.0%} of 1-thread, {gbs / bwn:.0%} of "
              f"{n_cpus}-thread bandwidth)")
        prefill = C.samples(ok, "prefill_tps")
        flops = prefill_flops_per_token(machine.model, result["prompt_tokens"])
        quant = settings.quant if settings.quant != "source" else machine.model.file_type
        peak_name = "fp32" if quant.upper() in FLOAT_TYPES else "int8"
        achieved = C.median(prefill) * flops / 1e9
        share = f"{achieved / peaks[peak_name]:.1%} of the {peak_name} GEMM peak" if peak_name in peaks else "no peak"
        print(f"{' ' * len(name)}  prefill {C.spread(prefill, ' t/s', 1)} x {flops / 1e9:.3f} GFLOP/token "
              f"= {achieved:.1f} GFLOP/s; {share}")
    if "recommended" in configs:
        stored = load_recommendation(rec).get("roofline")
        print(f"recommendation file's own roofline (search-time figures): {stored or 'none stored'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
