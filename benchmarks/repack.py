"""Weight repacking: what llama.cpp's extra buffer types are worth per weight type on this machine.

For each weight type (the shipped file and variants made from it) the engine probe runs first
(``tuner.backends.llama_cpp.health``: a tiny eval with repacking on, in a child process). Where repacking crashes,
that is the figure: the type is reported as unusable with repacking and nothing else is
measured for it. Elsewhere the same config (2 threads or all CPUs, flash attention, the
workload's n_ctx) runs with repacking on and off, alternating the order each round, and each
round gives one paired ratio on/off of the trial medians; the table shows the median ratio with
its spread.

Usage: ``python benchmarks/repack.py [--quick] [--rounds 4] [--quants source,Q4_0,Q8_0,F16]``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402

from tuner.backends.llama_cpp.backend import LlamaCpp  # noqa: E402
from tuner.backends.llama_cpp.health import probe_repack  # noqa: E402
from tuner.backends.settings import TrialSettings  # noqa: E402
from tuner.config.workloads import get_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__)
    p.add_argument("--rounds", type=int, help="paired rounds per weight type (default 4; --quick: 1)")
    p.add_argument("--repetitions", type=int, help="timed repetitions per trial (default 3; --quick: 1)")
    p.add_argument("--quants", help="weight types (default source,Q4_0,Q8_0,F16; --quick: source)")
    a = p.parse_args(argv)
    rounds = a.rounds or (1 if a.quick else 4)
    reps = a.repetitions or (1 if a.quick else 3)
    quants = (a.quants or ("source" if a.quick else "source,Q4_0,Q8_0,F16")).split(",")
    workload = get_workload("tiny" if a.quick else "default")
    machine = C.Machine.detect()
    cpus = machine.profile.n_cpus
    C.header("weight repacking (llama.cpp extra buffer types) on and off", machine,
             workload=f"{workload.name} ({workload.prompt_tokens} prompt / {workload.generate_tokens} generated)",
             config=f"{cpus} thread(s) for prefill and decode, flash attention, f16 KV cache",
             re_measurement=f"{rounds} alternating rounds x 2 configs per weight type, {reps} repetitions per trial")
    n_ctx = max(256, -(-workload.needed_ctx() // 256) * 256)
    for quant in quants:
        base = TrialSettings(backend=LlamaCpp.name, quant=quant, n_threads=cpus, n_threads_batch=cpus,
                             n_ctx=n_ctx, flash_attn=True)
        path, _ = C.model_path_for(machine.model, base)
        label = machine.model.file_type if quant == "source" else quant
        verdict = probe_repack(path, label)
        if not verdict.usable:
            print(f"{label:<6} repacking unusable: {verdict.evidence}")
            continue
        out = C.interleave(machine.model, {"on": base, "off": base.model_copy(update={"repack": False})},
                           workload, rounds, reps)
        prefill = C.paired_ratios(out["off"], out["on"], "prefill_tps")
        decode = C.paired_ratios(out["off"], out["on"], "decode_tps")
        print(f"{label:<6} repack on/off: prefill {C.spread(prefill, 'x')}; decode {C.spread(decode, 'x')}")
        for name in ("on", "off"):
            print(f"       {name:<3} prefill {C.spread(C.samples(out[name], 'prefill_tps'), ' t/s', 1)}; "
                  f"decode {C.spread(C.samples(out[name], 'decode_tps'), ' t/s', 1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
