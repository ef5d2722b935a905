"""Shared pieces of the benchmark scripts: arguments, measuring configs side by side, spread figures.

Every benchmark measures through the library itself: a config runs in its own child process
with :func:`tuner.measure.runner.run_child` (under the machine-wide trial lock, as ``autotune run``
does), and tuning runs go through :func:`tuner.search.tune.tune` into a fresh SQLite database, so
a benchmark never resumes a user's study. Timings on a shared machine drift by tens of
percent, so figures are ratios measured side by side, reported as medians with their spread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
if str(ROOT) not in sys.path:  # `python benchmarks/x.py` from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

from optuna.exceptions import ExperimentalWarning  # noqa: E402

from tuner.measure import records as R  # noqa: E402
from tuner.config.model import ModelInfo, resolve_model  # noqa: E402
from tuner.machine.profile import MachineProfile, detect_profile  # noqa: E402
from tuner.measure.rounds import interleaved  # noqa: E402
from tuner.measure.lock import machine_lock  # noqa: E402
from tuner.measure.runner import run_child  # noqa: E402
from tuner.measure.spec import TrialSpec  # noqa: E402
from tuner.search.weights import prepare_weights  # noqa: E402
from tuner.backends.settings import TrialSettings, config_key, normalize  # noqa: E402
from tuner.backends.llama_cpp.health import EngineHealth  # noqa: E402
from tuner.config.workloads import Workload  # noqa: E402

# This process's repacking verdicts: a weight type whose repacked kernels crash llama.cpp here (the
# AMX buffer type on some Intel VMs) is measured with repacking off, as `autotune run` measures it.
_ENGINE = EngineHealth(key="benchmark")

warnings.filterwarnings("ignore", category=ExperimentalWarning)  # Optuna's multivariate/group TPE

SPACES_DIR = BENCH_DIR / "spaces"
DEFAULT_CACHE = BENCH_DIR / ".cache"
TRIAL_TIMEOUT_S = 300.0


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark shares (``--quick``, ``--cache-dir``)."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny budgets and workloads (what the tests run)")
    p.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("AUTOTUNE_BENCH_CACHE", DEFAULT_CACHE)),
                   help="where measured tables and the last recommendation are kept (default: %(default)s)")
    return p


def variants_ready() -> bool:
    """Whether the library can make quantized variants of the model (``tuner.backends.llama_cpp.quant.ensure_variant``)."""
    try:
        from tuner.backends.llama_cpp.quant import ensure_variant  # noqa: F401
    except ImportError:
        return False
    return True


def quant_ready() -> bool:
    """Whether quant types can be searched with tune()'s quality gate: variants and their perplexity."""
    try:
        from tuner.backends.llama_cpp.quality import measure_quality  # noqa: F401
    except ImportError:
        return False
    return variants_ready()


def quality_gate() -> float | None:
    """The largest perplexity loss tuning runs allow (tune()'s default), or None while it cannot be measured."""
    return 0.05 if quant_ready() else None


def default_space() -> Path:
    """The llama.cpp space shipped with autotune, or the same space without quant types if none can be made."""
    if variants_ready():
        return ROOT / "search_spaces" / "llama-cpp.yaml"
    return SPACES_DIR / "llama-cpp-noquant.yaml"


@dataclass(frozen=True)
class Machine:
    """The model and machine a benchmark runs on."""

    model: ModelInfo
    profile: MachineProfile

    @classmethod
    def detect(cls, model: str | None = None) -> "Machine":
        """The model file ``model`` (default: the bundled model) on this machine."""
        return cls(model=resolve_model(model), profile=detect_profile())


def header(title: str, machine: Machine, **facts: Any) -> None:
    """Print what ran where, and how busy the machine was (other processes distort timings)."""
    p = machine.profile
    print(f"== {title} ==")
    print(f"machine: {p.name} (profile {p.id}), {p.cpu_model}, {p.n_cpus} CPU(s); "
          f"llama-cpp-python {p.llama_cpp_python}")
    print(f"model: {Path(machine.model.path).name} ({machine.model.size_bytes / 2**20:.1f} MiB, "
          f"{machine.model.file_type})")
    print(f"load average at start: {load_average()} (above {p.n_cpus} means other work shares the CPUs)")
    for key, value in facts.items():
        print(f"{key.replace('_', ' ')}: {value}")
    sys.stdout.flush()


def load_average() -> str:
    """The 1-minute load average, or 'n/a'."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "n/a"


def model_path_for(model: ModelInfo, settings: TrialSettings) -> tuple[str, int]:
    """The weights file a config runs on (a quant variant is made once and cached) and its size."""
    prepared = prepare_weights(model, settings, None, say=lambda text: log(f"  {text}"))
    if prepared.unusable:
        raise RuntimeError(f"quant type {settings.quant} is unusable here: {prepared.unusable}")
    return str(prepared.model_path), int(prepared.model_facts["size_bytes"])


def measure(model: ModelInfo, settings: TrialSettings, workload: Workload, repetitions: int,
            timeout_s: float = TRIAL_TIMEOUT_S) -> R.TrialOutcome:
    """One trial of ``settings`` in its own child process, as ``autotune run`` measures it: the library's own
    preparation (:func:`tuner.search.weights.prepare_weights`: the weights variant, repacking off where this
    machine's engine check says it crashes), then the child."""
    settings, _ = normalize(settings)
    prepared = prepare_weights(model, settings, _ENGINE, say=lambda text: log(f"  {text}"))
    if prepared.unusable:
        raise RuntimeError(f"quant type {settings.quant} is unusable here: {prepared.unusable}")
    spec = TrialSpec.of(str(prepared.model_path), prepared.settings, workload, repetitions)
    with machine_lock(on_wait=lambda: log("  waiting: another trial holds the machine lock")):
        return run_child(spec, timeout_s=timeout_s, memory_ceiling=None)


def interleave(model: ModelInfo, configs: dict[str, TrialSettings], workload: Workload, rounds: int,
               repetitions: int) -> dict[str, list[R.TrialOutcome]]:
    """Measure every config once per round, alternating the order each round (A B, B A, ...).

    Alternating cancels a steady drift of the machine's speed between configs; each round
    gives one paired comparison. Names whose settings are the same config (two seeds that
    recommend one config, a pick that is the grid's optimum) share one measurement per round:
    shorter rounds drift less, and one config never shows two figures. A failed trial is kept
    (its result is None).
    """
    key_of = {name: config_key(settings) for name, settings in configs.items()}
    distinct = {key_of[name]: name for name in reversed(list(configs))}  # key -> its first name
    names = sorted(distinct.values(), key=list(configs).index)
    out: dict[str, list[R.TrialOutcome]] = {name: [] for name in names}
    for r, name in interleaved(names, rounds):
        outcome = measure(model, configs[name], workload, repetitions)
        out[name].append(outcome)
        figures = (f"prefill {median(outcome.result['prefill_tps']):.1f} t/s, decode "
                   f"{median(outcome.result['decode_tps']):.1f} t/s") if outcome.ok else \
            f"{outcome.status}: {outcome.reason}"
        log(f"  round {r + 1}/{rounds} {name}: {figures} ({outcome.wall_s:.1f}s)")
    return {name: out[distinct[key_of[name]]] for name in configs}


def paired_ratios(a: list[R.TrialOutcome], b: list[R.TrialOutcome], figure: str) -> list[float]:
    """Per-round ratio b/a of the trial medians of ``figure`` (e.g. 'decode_tps'), both trials OK."""
    return [median(y.result[figure]) / median(x.result[figure]) for x, y in zip(a, b) if x.ok and y.ok]


def samples(outcomes: list[R.TrialOutcome], figure: str) -> list[float]:
    """Every repetition of ``figure`` over the OK trials."""
    return [v for o in outcomes if o.ok for v in o.result[figure]]


def median(values: list[float]) -> float:
    """The median (NaN for no values), as :class:`tuner.measure.records.Stat` gives it."""
    stat = R.Stat.of(values)
    return stat.median if stat else float("nan")


def cv(values: list[float]) -> float:
    """Coefficient of variation (population), 0 for fewer than two values: :class:`tuner.measure.records.Stat`'s."""
    stat = R.Stat.of(values)
    return stat.cv if stat else 0.0


def spread(values: list[float], unit: str = "", digits: int = 2) -> str:
    """``median unit (IQR q1-q3, min-max lo-hi, n=N)``; the IQR only from 4 values on."""
    if not values:
        return "n/a (no successful measurement)"
    f = f"{{:.{digits}f}}"
    text = f"{f.format(median(values))}{unit} ("
    if len(values) >= 4:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        text += f"IQR {f.format(q1)}-{f.format(q3)}, "
    return text + f"min-max {f.format(min(values))}-{f.format(max(values))}, n={len(values)})"


def log(text: str) -> None:
    """Progress for a person watching: stderr, so stdout holds only the figures."""
    print(text, file=sys.stderr, flush=True)


class LineProgress:
    """Prints one short stderr line per finished trial of a tuning run."""

    def status(self, text: str) -> None:
        log(f"  {text}")

    def trial_started(self, number: int, role: str, settings: dict[str, Any], elapsed: float) -> None:
        pass

    def trial_finished(self, number: int, record: Any, best: dict[str, float], elapsed: float) -> None:
        figures = f"prefill {record.prefill}, decode {record.decode}" if record.outcome.ok else \
            f"{record.outcome.status}: {record.outcome.reason or record.violation}"
        if record.violation and record.outcome.ok:
            figures += f"  (infeasible: {record.violation})"
        log(f"  #{number} {elapsed:6.1f}s {record.role:<9} {figures}")


@dataclass
class TuneRun:
    """A finished tuning run: the library's result, its study's records and the wall time."""

    result: Any
    records: list[R.TrialRecord]
    wall_s: float
    candidates: list[Any] = None  # type: ignore[assignment]  # the study's pooled configs (tuner.selection.candidates)
    # (seconds from the run's start to a trial's end, that trial's request seconds), in time order
    timeline: list[tuple[float, float]] = None  # type: ignore[assignment]
    warm_started: bool = False  # whether the study queued a warm start from another profile

    def seconds_to(self, target_s: float) -> float | None:
        """Seconds from the start until a trial measured a request time of at most ``target_s``."""
        return next((at for at, request in self.timeline if request <= target_s), None)

    def best(self, objective: str = "request_time") -> Any:
        """The config the run recommends (its candidates ranked by ``objective``)."""
        from tuner.selection import decision

        return decision.best(self.candidates, objective)


def run_tune(budget_s: float, space: Path, workload: str, repetitions: int, seed: int | None,
             output: Path | None = None, trial_timeout_s: float = TRIAL_TIMEOUT_S, url: str | None = None,
             cpus: list[int] | None = None, depth: str | None = None, model: str | None = None) -> TuneRun:
    """``tune()`` of ``model`` (default: the bundled one) into ``url`` (default: a fresh temporary SQLite study),
    restricted to ``cpus`` if given (this process's CPU affinity is restored after); the recommendation goes to
    ``output``. A model made for speed only (``autotune.speed_only``) runs without a quality guard: tune() reads it."""
    import datetime as dt

    import optuna

    from tuner.search.run import WARM_ATTR
    from tuner.search.tune import TuneOptions, tune
    from tuner.selection.candidates import candidates, records
    from tuner.results.storage import open_storage

    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as tmp:
        url = url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        options = TuneOptions(model=model, budget_s=budget_s, space=str(space), storage=url, workload=workload,
                              repetitions=repetitions, seed=seed, output=str(output or Path(tmp) / "rec.yaml"),
                              trial_timeout_s=trial_timeout_s, cpus=cpus, max_quality_loss=quality_gate(),
                              depth=depth)
        affinity = os.sched_getaffinity(0)
        started, start = dt.datetime.now(), time.monotonic()
        try:
            result = tune(options, LineProgress())  # type: ignore[arg-type]
        finally:
            os.sched_setaffinity(0, affinity)
        wall = time.monotonic() - start
        study = optuna.load_study(study_name=result.study_name, storage=open_storage(url).rdb)
        pairs = records(study)
        timeline = sorted((t.datetime_complete.timestamp() - started.timestamp(), rec.request.median)
                          for t, rec in pairs if t.datetime_complete and rec.request and rec.request.median > 0)
        warm = any(t.user_attrs.get(WARM_ATTR) for t in study.get_trials(deepcopy=False))
        return TuneRun(result=result, records=[rec for _, rec in pairs], wall_s=wall, candidates=candidates(study),
                       timeline=timeline, warm_started=warm)


class LoadProcess:
    """A background CPU load: one Python process running :meth:`code` from ``__enter__`` until ``__exit__``
    (killed, and waited for)."""

    def __init__(self) -> None:
        self.process: Any = None

    def code(self) -> str:
        """The Python source the load runs."""
        raise NotImplementedError

    def __enter__(self) -> Any:
        import subprocess

        self.process = subprocess.Popen([sys.executable, "-c", self.code()])
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


class Noise(LoadProcess):
    """A bounded background CPU load for ``--noise`` runs: one process that keeps one CPU busy for 2-8 s
    at a time, idle 2-8 s between bursts (random, seeded), from ``start()`` until ``stop()``.

    It stands for what a user's machine does while autotune runs (a build, a browser tab): the tuning
    must still pick the quiet machine's best. Use it around tuning runs only, never around the
    re-measurement that judges them.
    """

    CODE = ("import random, time\n"
            "rng = random.Random({seed})\n"
            "while True:\n"
            "    time.sleep(rng.uniform(2, 8))\n"
            "    end = time.monotonic() + rng.uniform(2, 8)\n"
            "    while time.monotonic() < end:\n"
            "        pass\n")

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = seed

    def code(self) -> str:
        """The seeded bursts."""
        return self.CODE.format(seed=self.seed)
