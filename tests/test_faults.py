"""Fault injection: each fault autotune claims to survive, injected for real, and the study checked after.

Faults of a trial's child (segfault, abort, a hang past the timeout, memory past the ceiling)
come from ``AUTOTUNE_FAULT=kind:trial_number,...``; faults of the parent are real signals sent to a
real ``autotune run`` process in the middle of a trial; the database is unreachable before a
run or taken away during one. Afterwards the study must hold every completed trial, no trial
may be left RUNNING, and the next run must carry on. Bad inputs must stop with one ``Error:``
line before anything is written. The totals (faults injected, survived, trials lost) are
printed at the end of the test session.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
import psutil
import pytest
from click.testing import CliRunner
from optuna.trial import FrozenTrial, TrialState
from pgserver import PgServer, free_port, pg_server, pg_url  # noqa: F401 - fixtures

import tuner
from tuner.measure import records as R
from tuner.cli import cli
from tuner.measure.records import record_of
from tuner.results.storage import open_storage
from tuner.results.studies import PENDING_ATTR, fail_orphans, mark_failed

from fault_tally import TALLY, counted, fault  # noqa: F401 - counted: other modules import it from here

# heartbeats with ask/tell are intended here: autotune records them itself around each trial
pytestmark = [pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
              pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")]

REPO = Path(tuner.__file__).resolve().parent.parent
AUTOTUNE = [sys.executable, "-c", "from tuner.cli import main; main()"]


# --- autotune as a separate process -------------------------------------------------------------

@dataclass
class Worker:
    """One ``autotune run`` in its own process; stdout and stderr go to files."""

    proc: subprocess.Popen
    out: Path
    err: Path

    @classmethod
    def start(cls, args: list[str], folder: Path, name: str, fault: str | None = None,
              env: dict[str, str] | None = None) -> "Worker":
        """Start ``autotune run ARGS`` from this checkout, with ``AUTOTUNE_FAULT`` set to ``fault``."""
        environ = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})}
        environ.pop("AUTOTUNE_FAULT", None)
        if fault:
            environ["AUTOTUNE_FAULT"] = fault
        out, err = folder / f"{name}.out", folder / f"{name}.err"
        with out.open("w") as fout, err.open("w") as ferr:
            proc = subprocess.Popen([*AUTOTUNE, "run", *args], stdin=subprocess.DEVNULL, stdout=fout,
                                    stderr=ferr, env=environ, cwd=folder)
        return cls(proc, out, err)

    def wait(self, timeout: float) -> int:
        """The exit status; the process is killed and the test fails if it runs past ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"autotune still running after {timeout}s:\n{self.stdout}\n{self.stderr}")

    @property
    def stdout(self) -> str:
        """What it printed on stdout so far."""
        return self.out.read_text()

    @property
    def stderr(self) -> str:
        """What it printed on stderr so far."""
        return self.err.read_text()

    def trial_children(self) -> list[int]:
        """Process ids of its running trial children (``python -m tuner.backends.child``)."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for kid in kids:
            with contextlib.suppress(psutil.Error):
                if "tuner.backends.child" in kid.cmdline():
                    out.append(kid.pid)
        return out


def run_args(space: Path, storage: str, budget: float, *extra: str) -> list[str]:
    """``autotune run`` arguments for a short real run on the tiny workload.

    The run is pinned to the first CPU this process may use: one-thread trials slow down gracefully on a machine shared
    with other work, where several llama.cpp threads waiting on each other do not.
    """
    return ["--budget", f"{budget}s", "--workload", "tiny", "--space", str(space), "--storage", storage,
            "--max-quality-loss", "none", "--repetitions", "1", "--trial-timeout", "60s", "--cpus", str(min(os.sched_getaffinity(0))),
            *extra]


def all_trials(url: str) -> dict[str, list[FrozenTrial]]:
    """Every study's trials, read without creating or changing anything."""
    rdb = optuna.storages.RDBStorage(url, skip_table_creation=True, skip_compatibility_check=True)
    try:
        return {s.study_name: optuna.load_study(study_name=s.study_name, storage=rdb).get_trials()
                for s in optuna.get_all_study_summaries(rdb, include_best_trial=False)}
    finally:
        rdb.engine.dispose()


def study_trials(url: str) -> list[FrozenTrial]:
    """The trials of the one study in ``url``."""
    studies = all_trials(url)
    assert len(studies) == 1, f"expected one study, found {sorted(studies)}"
    return next(iter(studies.values()))


def completed(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of the COMPLETE trials."""
    return {t.number for t in trials if t.state == TrialState.COMPLETE}


def by_number(trials: list[FrozenTrial], number: int) -> FrozenTrial:
    """The trial numbered ``number``."""
    (trial,) = [t for t in trials if t.number == number]
    return trial


def check_study(trials: list[FrozenTrial], completed_before: set[int]) -> None:
    """Nothing lost: numbers 0..n-1, none RUNNING, each finished trial recorded, earlier completions kept."""
    running = [t.number for t in trials if t.state == TrialState.RUNNING]
    lost = completed_before - completed(trials)
    TALLY.trials_lost += len(running) + len(lost)
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    assert not running, f"trials left RUNNING: {running}"
    assert not lost, f"completed trials lost: {sorted(lost)}"
    for trial in trials:
        assert record_of(trial) is not None, f"trial {trial.number} ({trial.state.name}) has no record"


def wait_until(what: str, predicate: Callable[[], bool], timeout: float, poll: float = 0.3) -> None:
    """Poll ``predicate`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def wait_mid_trial(worker: Worker, url: str, number: int, timeout: float = 90) -> list[int]:
    """Wait until trial ``number`` is RUNNING in the database and its child runs; the child pids."""
    found: list[int] = []

    def ready() -> bool:
        assert worker.proc.poll() is None, f"autotune exited early:\n{worker.stdout}\n{worker.stderr}"
        try:
            running = {t.number for trials in all_trials(url).values() for t in trials
                       if t.state == TrialState.RUNNING}
        except Exception:  # noqa: BLE001 - the database may not have its tables yet
            return False
        found[:] = worker.trial_children()
        return number in running and bool(found)

    wait_until(f"trial {number} to run", ready, timeout)
    time.sleep(0.5)  # let the child arm its parent-death signal
    return list(found)


def gone(pids: list[int]) -> bool:
    """Whether none of ``pids`` is still a live trial child."""
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and "tuner.backends.child" in proc.cmdline():
                return False
    return True


def one_error_line(text: str) -> str:
    """The single ``Error: ...`` line that ``text`` must consist of."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), text
    return lines[0]


# --- faults inside a trial's child --------------------------------------------------------------

CHILD_FAULTS = {  # trial number: (kind, stored status, signal, words in the child's stderr)
    1: ("segfault", R.CRASHED, "SIGSEGV", "Segmentation fault"),
    3: ("abort", R.CRASHED, "SIGABRT", "Aborted"),
    5: ("oom", R.OVER_CEILING, "SIGKILL", ""),
    7: ("hang", R.TIMEOUT, "SIGKILL", ""),
}


@pytest.mark.slow
def test_child_faults_are_recorded_and_the_search_goes_on(tiny_space: Path, sqlite_url: str, tmp_path: Path) -> None:
    """One run; trial 0 is the baseline, then every other trial's child misbehaves in its own way."""
    spec = ",".join(f"{kind}:{at}" for at, (kind, *_) in CHILD_FAULTS.items())
    worker = Worker.start(run_args(tiny_space, sqlite_url, 50, "--memory-ceiling", "1GiB", "--trial-timeout", "10s"),
                          tmp_path, "child-faults", fault=spec)
    for kind, *_ in CHILD_FAULTS.values():
        TALLY.injected.append(f"child {kind}")
    assert worker.wait(150) == 0, worker.stdout + worker.stderr
    trials = study_trials(sqlite_url)
    check_study(trials, set())
    for at, (kind, status, sig, words) in CHILD_FAULTS.items():
        rec = record_of(by_number(trials, at))
        assert rec.outcome.status == status and rec.outcome.signal == sig, (kind, rec.outcome)
        assert words in rec.outcome.stderr_tail and rec.outcome.reason
        if status == R.OVER_CEILING:  # a constraint the sampler learns from, not a failure
            assert by_number(trials, at).state == TrialState.COMPLETE and rec.violation
            assert rec.outcome.memory.peak_rss > 1 << 30
        else:
            assert by_number(trials, at).state == TrialState.FAIL
        assert any(t.number > at and record_of(t).outcome.ok for t in trials), f"nothing completed after the {kind}"
        TALLY.survived.append(f"child {kind}")


# --- faults of the parent: signals mid-trial ----------------------------------------------------

@pytest.mark.slow
def test_signals_mid_trial_stop_the_child_mark_the_trial_and_the_study_resumes(
        tiny_space: Path, sqlite_url: str, tmp_path: Path) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to ``autotune run`` while a trial hangs, then a clean run."""
    args = run_args(tiny_space, sqlite_url, 120, "--trial-timeout", "120s")
    before: set[int] = set()
    for sig in (signal.SIGINT, signal.SIGTERM):
        at = len(study_trials(sqlite_url)) if before else 1
        with fault(sig.name):
            worker = Worker.start(args, tmp_path, sig.name, fault=f"hang:{at}")
            kids = wait_mid_trial(worker, sqlite_url, at)
            before = completed(study_trials(sqlite_url))
            worker.proc.send_signal(sig)
            code = worker.wait(30)
            assert code == 130, (code, worker.stderr)
            assert "Interrupted" in worker.stderr and "Traceback" not in worker.stderr, worker.stderr
            assert gone(kids), f"trial child {kids} survived {sig.name}"
            trials = study_trials(sqlite_url)
            check_study(trials, before)
            rec = record_of(by_number(trials, at))
            assert by_number(trials, at).state == TrialState.FAIL and rec.outcome.status == R.INTERRUPTED
            assert rec.role == "search"  # a resumed run does not measure the baseline again
            before = completed(trials)

    with fault("SIGKILL"):
        at = len(study_trials(sqlite_url))
        worker = Worker.start(args, tmp_path, "sigkill", fault=f"hang:{at}")
        kids = wait_mid_trial(worker, sqlite_url, at)
        worker.proc.kill()
        assert worker.wait(10) == -signal.SIGKILL
        wait_until("the orphaned trial child to die with its parent", lambda: gone(kids), 10)
        assert by_number(study_trials(sqlite_url), at).state == TrialState.RUNNING  # nobody could mark it

        nxt = Worker.start(run_args(tiny_space, sqlite_url, 8), tmp_path, "after-sigkill")
        assert nxt.wait(90) == 0, nxt.stdout + nxt.stderr
        assert "(resumed)" in nxt.stdout and f"as failed: [{at}]" in nxt.stdout, nxt.stdout
        trials = study_trials(sqlite_url)
        check_study(trials, before)
        rec = record_of(by_number(trials, at))
        assert rec.outcome.status == R.ORPHANED and "is gone" in rec.outcome.reason


def test_stale_heartbeat_of_another_host_is_orphaned(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial of a worker on another machine is failed once its heartbeat is older than the grace period."""
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_GRACE", "1")
    storage = open_storage(sqlite_url)
    study = optuna.create_study(study_name="fleet", storage=storage.rdb)
    elsewhere = {"host": "another-machine", "pid": 4242, "started": time.time()}
    silent, alive, never = study.ask(), study.ask(), study.ask()
    for trial in (silent, alive, never):
        trial.set_user_attr(PENDING_ATTR, {"role": "search", "settings": {"n_threads": 1},
                                           "config_key": "k", "notes": [], "worker": elsewhere})
    with fault("stale heartbeat"):
        storage.heartbeat(silent)
        time.sleep(2.2)  # SQLite's clock has whole seconds
        storage.heartbeat(alive)
        assert fail_orphans(storage, study) == [silent.number]
        frozen = study.get_trials()
        rec = record_of(frozen[silent.number])
        assert frozen[silent.number].state == TrialState.FAIL and rec.outcome.status == R.ORPHANED
        assert "no heartbeat" in rec.outcome.reason and rec.settings == {"n_threads": 1}
        assert frozen[alive.number].state == frozen[never.number].state == TrialState.RUNNING
        # A second worker reaching the same orphan a moment later leaves it alone.
        assert mark_failed(storage, storage.trial_id(silent), {}, R.ORPHANED, "again") is False
        assert record_of(study.get_trials()[silent.number]).outcome.reason == rec.outcome.reason


def test_a_trial_is_cut_at_the_runs_deadline(model_path: Path, sqlite_url: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A child still running at budget + one trial timeout is stopped there and marked interrupted."""
    from tuner.config.model import resolve_model
    from tuner.search.progress import Progress
    from tuner.backends.settings import TrialSettings
    from tuner.search.state import DEADLINE_REASON, TrialContext
    from tuner.search.trial import run_trial
    from tuner.config.workloads import get_workload

    storage = open_storage(sqlite_url)
    study = optuna.create_study(study_name="deadline", storage=storage.rdb, directions=["maximize"] * 2)
    base = dict(storage=storage, study=study, model=resolve_model(model_path), workload=get_workload("tiny"),
                objective="pareto", repetitions=1, memory_ceiling=4 << 30, timeout_s=120, progress=Progress())
    monkeypatch.setenv("AUTOTUNE_FAULT", "hang")
    with fault("hang at the run's deadline"):
        start = time.monotonic()
        cut = run_trial(TrialContext(**base, deadline=start + 4), study.ask(), TrialSettings(n_ctx=256), "search")
        assert time.monotonic() - start < 30  # not the 120 s trial timeout
        assert cut.outcome.status == R.INTERRUPTED and cut.outcome.reason == DEADLINE_REASON
        late = run_trial(TrialContext(**base, deadline=time.monotonic()), study.ask(),
                         TrialSettings(n_ctx=256), "search")
        assert late.outcome.status == R.INTERRUPTED and late.outcome.reason == DEADLINE_REASON
        # Too little time left to make, probe or score weights (a wait for the machine lock took it): none
        # are made, and the trial says why.
        said: list[str] = []

        class Said(Progress):
            def status(self, text: str) -> None:
                said.append(text)

        close = run_trial(TrialContext(**{**base, "progress": Said()},
                                       deadline=time.monotonic() + 2), study.ask(),
                          TrialSettings(n_ctx=256, quant="Q5_0"), "search")
        assert close.outcome.status == R.INTERRUPTED and not late.model and not close.model
        assert not any("quantiz" in line or "engine check" in line or "perplexity" in line for line in said), said
        assert [t.state for t in study.get_trials()] == [TrialState.FAIL] * 3


# --- the database -------------------------------------------------------------------------------

@pytest.mark.slow
def test_database_unreachable_at_start(tiny_space: Path, tmp_path: Path, hermetic: Path) -> None:
    """A PostgreSQL URL where nothing listens: one line, exit 1, nothing written."""
    with fault("database unreachable at start"):
        url = f"postgresql://autotune:secret@127.0.0.1:{free_port()}/autotune"
        worker = Worker.start(run_args(tiny_space, url, 30), tmp_path, "unreachable")
        assert worker.wait(60) == 1
        line = one_error_line(worker.stderr)
        assert "check that the server is running" in line and "secret" not in line
        assert not hermetic.exists() or not any(hermetic.rglob("*"))


@pytest.mark.slow
@pytest.mark.postgres
def test_database_lost_mid_run(pg_server: PgServer, pg_url: str, tiny_space: Path, tmp_path: Path) -> None:
    """The PostgreSQL server stops during a trial: the run ends with one line; nothing is lost."""
    worker = Worker.start(run_args(tiny_space, pg_url, 120, "--trial-timeout", "120s"), tmp_path, "lost",
                          fault="hang:1")
    kids = wait_mid_trial(worker, pg_url, 1)
    before = completed(study_trials(pg_url))
    with fault("database lost mid-run"):
        pg_server.stop("fast")
        try:
            code = worker.wait(60)
        finally:
            pg_server.start()
        assert code == 1, worker.stderr
        assert "check that the server is running" in one_error_line(worker.stderr)
        assert gone(kids)
        assert completed(study_trials(pg_url)) == before  # safe on the server
        nxt = Worker.start(run_args(tiny_space, pg_url, 5), tmp_path, "after-lost")
        assert nxt.wait(90) == 0, nxt.stdout + nxt.stderr
        trials = study_trials(pg_url)
        check_study(trials, before)
        assert record_of(by_number(trials, 1)).outcome.status == R.ORPHANED


# --- bad inputs ---------------------------------------------------------------------------------

def _space(text: str) -> Callable[[Path, Path], list[str]]:
    def make(tmp: Path, model: Path) -> list[str]:
        path = tmp / "space.yaml"
        path.write_text(text)
        return ["--space", str(path)]
    return make


def _model(content: Callable[[bytes], bytes]) -> Callable[[Path, Path], list[str]]:
    def make(tmp: Path, model: Path) -> list[str]:
        path = tmp / "model.gguf"
        path.write_bytes(content(model.read_bytes()))
        return ["--model", str(path)]
    return make


def _laughs() -> str:
    lines = ['  a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"  {name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return ("version: 1\nworkloads:\n  laughs:\n" + "\n".join("  " + line for line in lines)
            + "\nparams:\n  n_batch: {choices: *i}\n")


TINY_PARAMS = "version: 1\nparams:\n  n_threads: {low: 1, high: auto}\n"
BAD_INPUTS = {
    "missing model": (lambda tmp, model: ["--model", str(tmp / "nope.gguf")], "does not exist"),
    "non-GGUF model": (_model(lambda data: b"<html>not a model</html>\n"), "not a GGUF file"),
    "empty model": (_model(lambda data: b""), "not a GGUF file"),
    "truncated GGUF": (_model(lambda data: data[:len(data) // 2]), r"corrupt GGUF header|truncated"),
    "corrupt GGUF header": (_model(lambda data: data[:4] + os.urandom(4096)), "corrupt GGUF header"),
    "YAML duplicate keys": (_space(TINY_PARAMS + "  n_threads: {low: 1, high: 2}\n"), "duplicate key"),
    "YAML huge range": (_space(TINY_PARAMS + "  n_ctx: {low: 256, high: 1000000000000}\n"), "less than or equal"),
    "YAML huge choice": (_space(TINY_PARAMS + "  n_batch: {choices: [64, 1000000000000]}\n"), "less than or equal"),
    "YAML non-scalar choices": (_space(TINY_PARAMS + "  n_batch: {choices: [[64, 128], {a: 1}]}\n"),
                                "params.n_batch.choices"),
    "YAML billion laughs": (_space(_laughs()), "search space"),
    "YAML deep nesting": (_space("version: 1\nparams: " + "[" * 50_000 + "]" * 50_000 + "\n"), "nested too deeply"),
    "YAML python tag": (_space('version: !!python/object/apply:os.system ["touch pwned"]\nparams: {}\n'),
                        "not valid YAML"),
    "YAML too large": (_space(TINY_PARAMS + "# " + "x" * 1_100_000 + "\n"), "larger than"),
    "YAML not a mapping": (_space("- n_threads\n- n_batch\n"), "must be a mapping"),
    "ceiling below model": (lambda tmp, model: ["--memory-ceiling", "50MB"], "smaller than the model"),
    "budget zero": (lambda tmp, model: ["--budget", "0"], "more than zero"),
    "budget negative": (lambda tmp, model: ["--budget", "-5m"], "cannot read the duration"),
    "budget garbage": (lambda tmp, model: ["--budget", "a while"], "cannot read the duration"),
    "storage URL garbage": (lambda tmp, model: ["--storage", "::not a url::"], "cannot read the storage URL"),
    "storage in memory (sqlite:///)": (lambda tmp, model: ["--storage", "sqlite:///"], "--ephemeral"),
    "storage in memory (:memory:)": (lambda tmp, model: ["--storage", "sqlite:///:memory:"], "--ephemeral"),
    "CPU list out of reach": (lambda tmp, model: ["--cpus", "0-1000"], "cannot use"),
    "CPU list empty": (lambda tmp, model: ["--cpus", ""], "--cpus is empty"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_1_and_writes_nothing(case: str, model_path: Path, tiny_space: Path,
                                                         tmp_path: Path, hermetic: Path) -> None:
    make, words = BAD_INPUTS[case]
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    args = make(inputs, model_path)
    if "--space" not in args:
        args += ["--space", str(tiny_space)]
    with fault(f"bad input: {case}"):
        start = time.monotonic()
        result = CliRunner().invoke(cli, ["run", "--workload", "tiny", "--max-quality-loss", "none", *args])
        assert time.monotonic() - start < 20
        assert result.exit_code == 1, result.output
        assert re.search(words, one_error_line(result.output)), result.output
        assert not hermetic.exists() or not any(hermetic.rglob("*")), "something was written"
        assert not (tmp_path / "pwned").exists() and not (inputs / "pwned").exists()


# --- nothing reaches a shell --------------------------------------------------------------------

SHELL_CALLS = re.compile(r"shell\s*=\s*True|os\.system\(|os\.popen\(|subprocess\.getoutput|"
                         r"subprocess\.getstatusoutput|os\.exec\w*p\w*\(\s*['\"](?:sh|bash)")


def test_paths_and_urls_never_reach_a_shell(tiny_space: Path, tmp_path: Path, hermetic: Path) -> None:
    """No shell anywhere in the package; hostile model paths and storage URLs stay plain strings."""
    offenders = [f"{path.relative_to(REPO)}:{n}" for path in (REPO / "tuner").rglob("*.py")
                 for n, line in enumerate(path.read_text().splitlines(), 1) if SHELL_CALLS.search(line)]
    assert not offenders, offenders
    with fault("shell metacharacters in a model path and a storage URL"):
        pwned = tmp_path / "pwned"
        runner = CliRunner()
        result = runner.invoke(cli, ["run", "--space", str(tiny_space), "--model", f"{tmp_path}/x; touch {pwned}"])
        assert result.exit_code == 1 and "does not exist" in one_error_line(result.output)
        result = runner.invoke(cli, ["run", "--space", str(tiny_space), "--workload", "tiny",
                                     "--max-quality-loss", "none", "--storage",
                                     f"postgresql://u@127.0.0.1:{free_port()}/db$(touch {pwned})`touch {pwned}`"])
        assert result.exit_code == 1 and "check that the server is running" in one_error_line(result.output)
        assert not pwned.exists()


# --- every command against every kind of broken location -----------------------------------------

def _file_at(tmp: Path) -> Path:
    path = tmp / "a-file"
    path.write_text("not a folder\n")
    return path


BROKEN_LOCATIONS = {
    # name: (environment / options that point at it, words the error line holds)
    "results folder is a file": (lambda tmp: ({"AUTOTUNE_RESULTS": str(_file_at(tmp))}, []),
                                 r"is a file|not a folder|no results database|cannot make"),
    "results folder under a file": (lambda tmp: ({"AUTOTUNE_RESULTS": str(_file_at(tmp) / "results")}, []),
                                    r"a file stands where a folder belongs|no results database|cannot make"),
    "database path is a folder": (lambda tmp: ({}, ["--storage", f"sqlite:///{tmp}"]),
                                  r"is a folder|no results database"),
    "database in a missing folder": (lambda tmp: ({}, ["--storage", f"sqlite:///{tmp / 'gone' / 'a.db'}"]),
                                     r"no results database|cannot make|does not exist"),
    "database file is not a database": (lambda tmp: ({}, ["--storage", f"sqlite:///{_file_at(tmp)}"]),
                                        r"not a database|no results yet|corrupt|damaged"),
}
COMMANDS = {"run": ["run", "--budget", "10s", "--workload", "tiny"], "profiles": ["profiles"], "trials": ["trials"],
            "best": ["best"], "export": ["export"], "compare": ["compare", "a", "b"], "report": ["report"],
            "check": ["check"]}


# `run` makes a database's missing folder (that is not broken for a writer); every other pair is.
BROKEN_PAIRS = [(c, w) for w in BROKEN_LOCATIONS for c in COMMANDS if (c, w) != ("run", "database in a missing folder")]


@pytest.mark.parametrize(("command", "where"), BROKEN_PAIRS)
def test_every_command_meets_a_broken_location_with_one_line(command: str, where: str, tmp_path: Path,
                                                            hermetic: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make, words = BROKEN_LOCATIONS[where]
    env, options = make(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with fault(f"{command} with {where}"):
        result = CliRunner().invoke(cli, [*COMMANDS[command], *options])
        assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
        assert isinstance(result.exception, SystemExit), repr(result.exception)   # never a traceback
        assert re.search(words, one_error_line(result.output)), result.output
