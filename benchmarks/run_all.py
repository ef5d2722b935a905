"""Run every benchmark in one go, one after the other, and collect their figures.

Order: measurement quality first (it says how far to trust the rest), then the speedup (whose
recommendation the roofline reads), roofline, regret (its table is cached, so a rerun is
cheap) and budget adherence. Each script runs as its own process with the given flags
(``--quick`` passes through); their stdout is printed and, with ``--output FILE``, written
to a markdown file as one fenced block per benchmark. Progress goes to stderr.

Full mode on a 2-CPU machine takes roughly 30-60 minutes (two 5-minute tuning runs, a 2m and
a 5m budget run, the 48-config regret table on a first run).

Usage: ``python benchmarks/run_all.py [--quick] [--only speedup,regret] [--output FILE]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ("quality", "speedup", "roofline", "regret", "budget", "repack", "objective", "warmstart", "grid", "depth")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny budgets (the tests' mode)")
    p.add_argument("--only", help=f"comma-separated subset of {','.join(ORDER)}")
    p.add_argument("--cache-dir", help="passed to every benchmark")
    p.add_argument("--output", type=Path, help="also write the figures to this markdown file")
    a = p.parse_args(argv)
    names = [n for n in ORDER if not a.only or n in a.only.split(",")]
    flags = (["--quick"] if a.quick else []) + (["--cache-dir", a.cache_dir] if a.cache_dir else [])
    sections, failed = [], []
    for name in names:
        print(f"\n# {name}", file=sys.stderr, flush=True)
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(HERE / f"{name}.py"), *flags], stdout=subprocess.PIPE,
                              text=True, check=False)
        took = time.monotonic() - start
        print(proc.stdout, end="", flush=True)
        if proc.returncode != 0:
            failed.append(name)
        sections.append(f"### {name}.py{' --quick' if a.quick else ''} ({took / 60:.1f} min, exit status "
                        f"{proc.returncode})\n\n```\n{proc.stdout.rstrip()}\n```\n")
    if a.output:
        a.output.write_text("\n".join(sections))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
