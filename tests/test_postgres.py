"""Several workers on one study: PostgreSQL for a fleet, and what SQLite does with two.

Real ``autotune run`` processes are started at the same moment on one fresh database (a
throwaway PostgreSQL cluster on loopback, see ``pgserver.py``); afterwards every trial must be
in its profile's study exactly once and finished, and the recommendation must come from all
of them. Trials of workers on one host take turns through the machine lock, as intended.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import FrozenTrial
from pgserver import PgServer, pg_server, pg_url  # noqa: F401 - fixtures
from test_faults import REPO, Worker, all_trials, check_study, one_error_line, run_args, study_trials

from tuner.selection import decision, candidates as select
from tuner.errors import AutotuneError
from tuner.machine.profile import detect_profile
from tuner.recommend.document import load as load_recommendation
from tuner.measure.records import record_of
from tuner.results.storage import SCHEMA_VERSION, open_storage

pytestmark = [pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
              pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")]

# Imports everything, says "ready", waits for "go", opens the storage; prints its retries and schema version.
OPENER = """
import sys, time, warnings
warnings.filterwarnings("ignore")
import tuner.results.storage as storage
retries = 0
class CountingTime:
    @staticmethod
    def sleep(seconds):
        global retries
        retries += 1
        time.sleep(seconds)
storage.time = CountingTime
print("ready", flush=True)
sys.stdin.readline()
opened = storage.open_storage(sys.argv[1])
print(retries, opened.schema_version())
"""


def worker_pids(trials: list[FrozenTrial]) -> set[int]:
    """Process ids of the workers that ran ``trials``."""
    return {record_of(t).worker["pid"] for t in trials}


def finish_all(workers: list[Worker], timeout: float) -> list[int]:
    """Wait for every worker; the indexes of ``workers`` in the order they finished."""
    order: list[int] = []
    deadline = time.monotonic() + timeout
    while len(order) < len(workers):
        for i, worker in enumerate(workers):
            if i not in order and worker.proc.poll() is not None:
                order.append(i)
        if time.monotonic() > deadline:
            for worker in workers:
                worker.proc.kill()
            pytest.fail(f"workers still running after {timeout}s")
        time.sleep(0.2)
    return order


def race_openers(url: str, n: int = 4) -> list[int]:
    """``n`` processes open the fresh database at ``url`` at the same instant; each one's retries."""
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
             for _ in range(n)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready", proc.communicate()[1]
    for proc in procs:  # go, all at once
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = [proc.communicate(timeout=120) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err for _, err in results]
    assert all(out.split()[1] == str(SCHEMA_VERSION) for out, _ in results)
    storage = open_storage(url)
    with storage.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM alembic_version")).scalar() == 1
        assert conn.execute(sa.text("SELECT count(*) FROM autotune_meta")).scalar() == 1
    return [int(out.split()[0]) for out, _ in results]


@pytest.mark.slow
@pytest.mark.parametrize("backend", [pytest.param("postgresql", marks=pytest.mark.postgres), "sqlite"])
def test_schema_is_created_once_when_workers_race(backend: str, request: pytest.FixtureRequest,
                                                  sqlite_url: str) -> None:
    """Four processes open one fresh database at the same instant: all succeed, one schema.

    Whether two openers really collide is up to the scheduler, so with PostgreSQL the race is
    run again on fresh databases (up to 5 rounds) until one round needed a retry: the retry
    path must have been exercised, and every round must end with one schema.
    """
    if backend == "sqlite":
        race_openers(sqlite_url)
        return
    server = request.getfixturevalue("pg_server")
    rounds = [race_openers(request.getfixturevalue("pg_url"))]
    while sum(rounds[-1]) == 0 and len(rounds) < 5:
        rounds.append(race_openers(server.new_database()))
    assert sum(rounds[-1]) >= 1, f"the openers never raced in {len(rounds)} rounds: no retry was needed"


@pytest.mark.postgres
def test_connections_survive_being_dropped_by_the_server(pg_server: PgServer, pg_url: str) -> None:
    """The server ends every session between two calls (idle timeout, failover): the next call reconnects."""
    storage = open_storage(pg_url)
    study = optuna.create_study(study_name="idle", storage=storage.rdb)
    study.tell(study.ask(), 1.0)
    assert pg_server.terminate_connections(pg_url.rsplit("/", 1)[1]) >= 1
    assert storage.schema_version() == SCHEMA_VERSION
    study.tell(study.ask(), 2.0)
    assert [t.value for t in optuna.load_study(study_name="idle", storage=storage.rdb).trials] == [1.0, 2.0]


@pytest.mark.alone  # needs every CPU, and its runs pinned to one CPU need that CPU quiet (tests/parallel.py)
@pytest.mark.slow
@pytest.mark.postgres
def test_fleet_workers_share_one_study_and_other_machines_get_their_own(
        pg_url: str, tiny_space: Path, tmp_path: Path) -> None:
    """Two workers of one machine kind and one of another start together on one fresh database."""
    def start(name: str, *extra: str) -> Worker:
        return Worker.start(run_args(tiny_space, pg_url, 30, "-o", str(tmp_path / f"{name}.yaml"), *extra),
                            tmp_path, name)

    fleet = [start("fleet-a", "--profile", "fleet"), start("fleet-b", "--profile", "fleet"),
             start("other", "--cpus", "1", "--profile", "fleet-cpu1")]
    order = finish_all(fleet, 240)
    for worker in fleet:
        assert worker.proc.returncode == 0, worker.stdout + worker.stderr
        assert "database is locked" not in worker.stderr and "Traceback" not in worker.stderr

    studies = all_trials(pg_url)
    assert sorted(name.split("/")[0] for name in studies) == ["fleet", "fleet-cpu1"]
    (shared,) = [trials for name, trials in studies.items() if name.startswith("fleet/")]
    (own,) = [trials for name, trials in studies.items() if name.startswith("fleet-cpu1/")]
    for trials in (shared, own):
        check_study(trials, set())
    assert worker_pids(shared) == {fleet[0].proc.pid, fleet[1].proc.pid}, "each fleet worker's trials are in the study"
    assert worker_pids(own) == {fleet[2].proc.pid}, "another machine kind never mixes into the fleet's study"

    # The fleet worker that finished last saw every trial of the study: its pick is the best of all.
    last = next(i for i in reversed(order) if i < 2)
    doc = load_recommendation(tmp_path / f"{('fleet-a', 'fleet-b')[last]}.yaml")
    study = optuna.load_study(study_name=doc["study"]["name"], storage=open_storage(pg_url).rdb)
    best = decision.best(select.candidates(study), doc["objective"])  # the study's objective (request_time)
    assert doc["settings"] == best.settings and doc["figures"]["trials"] == list(best.trials)
    # Every config either worker measured is weighed (the figures a candidate uses may be one worker's alone:
    # a confirmation stage is measured by whichever worker ran it).
    measured = {rec.config_key: rec.worker["pid"] for _, rec in select.records(study)
                if rec.feasible and rec.prefill and rec.decode}
    assert {cand.config_key for cand in select.candidates(study)} == set(measured)
    assert set(measured.values()) <= {fleet[0].proc.pid, fleet[1].proc.pid}


@pytest.mark.postgres
def test_same_profile_name_from_another_machine_kind_is_refused(pg_url: str) -> None:
    """A machine that differs from a fleet's but claims its profile name is refused, even in a race."""
    storage = open_storage(pg_url)
    fleet = detect_profile("fleet")
    storage.save_profile(fleet)
    storage.save_profile(fleet)  # the same machine kind again: fine
    with pytest.raises(AutotuneError, match="already belongs to another machine kind"):
        storage.save_profile(dataclasses.replace(fleet, id="0123456789ab"))


@pytest.mark.slow
def test_two_workers_on_one_sqlite_file(sqlite_url: str, tiny_space: Path, tmp_path: Path) -> None:
    """SQLite is for one worker, but two at once must not break: they take turns, or stop with the hint."""
    workers = [Worker.start(run_args(tiny_space, sqlite_url, 16, "-o", str(tmp_path / f"w{i}.yaml")),
                            tmp_path, f"w{i}") for i in range(2)]
    finish_all(workers, 180)
    for worker in workers:
        assert "Traceback" not in worker.stderr, worker.stderr
        if worker.proc.returncode != 0:
            line = one_error_line(worker.stderr)
            assert "SQLite is for one worker" in line and "postgresql://" in line
    trials = study_trials(sqlite_url)
    check_study(trials, set())
    assert worker_pids(trials) >= {w.proc.pid for w in workers if w.proc.returncode == 0}
