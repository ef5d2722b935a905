"""The results commands (profiles, profile, trials, best, export, report) over a database filled
by one short real run on this machine, with an injected crash; and their one-line user errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TINY_SPACE
from fixtures.invented import CHAT, add_study, bundled_model, invented_db  # noqa: F401  (a fixture)
from parallel import build_once

from tuner.measure import records as R
from tuner.recommend import document as recommend
from tuner.cli import cli
from tuner.recommend.query import this_profile_name
from tuner.search.tune import TuneOptions, tune
from tuner.selection.decision import PICKS
from tuner.results.storage import open_storage

# the module fixture is built once, on one worker
pytestmark = pytest.mark.xdist_group("cli_results")

ROW_FIELDS = {"number", "role", "state", "status", "cause", "detail", "settings", "config_key", "prefill_tps",
              "decode_tps", "decode_depth_tps", "depth", "peak_rss_bytes", "wall_s", "notes"}


@pytest.fixture(scope="module")
def real_db(request: pytest.FixtureRequest, shared_cache: Path) -> str:
    """A database filled by one short real run of the tiny space; trial 1 is made to segfault. Made once per
    set of CPUs the tests run on (a worker's own CPU: the profile these tests ask about is that machine's)."""
    def build(root: Path) -> None:
        (root / "tiny.yaml").write_text(TINY_SPACE)
        with pytest.MonkeyPatch.context() as mp:
            for name, value in (("RESULTS", root / "results"), ("CACHE_DIR", shared_cache),
                                ("MACHINE_LOCK", root / "machine.lock"), ("FAULT", "segfault:1")):
                mp.setenv(f"AUTOTUNE_{name}", str(value))
            tune(TuneOptions(budget_s=45, workload="tiny", space=str(root / "tiny.yaml"), storage=url_of(root),
                             repetitions=1, trial_timeout_s=60, seed=7, max_quality_loss=None, objective="pareto"))

    cpus = "-".join(map(str, sorted(os.sched_getaffinity(0))))
    return url_of(build_once(request, f"cli-results-cpus{cpus}", build))


def url_of(root: Path) -> str:
    """The SQLite URL of the database in ``root``."""
    return f"sqlite:///{root / 'autotune.db'}"


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout if result.exit_code == 0 else result.output


def _json(*args: str) -> dict:
    code, out = _run(*args, "--format", "json")
    assert code == 0, out
    return json.loads(out)


@pytest.mark.slow
def test_profiles(real_db: str) -> None:
    code, out = _run("profiles", "--storage", real_db)
    assert code == 0, out
    assert this_profile_name() in out and max(map(len, out.splitlines())) <= 100
    (row,) = _json("profiles", "--storage", real_db)
    assert set(row) == {"name", "id", "cpu_model", "cpus", "ram_gib", "gpu", "studies", "trials", "last_tuned"}
    assert row["name"] == this_profile_name() and row["studies"] == 1 and row["trials"] >= 2
    assert row["cpus"] == len(os.sched_getaffinity(0))


@pytest.mark.all_cpus  # needs every CPU, measures nothing a neighbour disturbs (tests/parallel.py)
def test_profile_of_this_machine() -> None:
    facts = _json("profile")
    assert facts["name"] == this_profile_name() and facts["cpus"] == sorted(os.sched_getaffinity(0))
    code, out = _run("profile")
    assert code == 0 and f"Profile {facts['name']}" in out and facts["id"] in out
    allowed = os.sched_getaffinity(0)
    try:  # --cpus restricts this process, as `run --cpus` does
        restricted = _json("profile", "--cpus", "0")
    finally:
        os.sched_setaffinity(0, allowed)
    assert restricted["cpus"] == [0] and restricted["name"].endswith(f"-1cpu-{facts['ram_gib']}gib")
    assert len(allowed) == 1 or restricted["id"] != facts["id"]


@pytest.mark.slow
def test_trials_of_this_machine_by_default(real_db: str) -> None:
    data = _json("trials", "--storage", real_db)
    rows = data["trials"]
    assert data["study"].startswith(this_profile_name() + "/SmolLM2-135M-Instruct.Q4_1-")
    assert [r["number"] for r in rows] == list(range(len(rows))) and set(rows[0]) == ROW_FIELDS
    assert rows[0]["role"] == "baseline" and rows[0]["state"] == "complete"
    assert rows[0]["decode_tps"]["median"] > 0 and rows[0]["peak_rss_bytes"] > 0
    crashed = rows[1]
    assert (crashed["state"], crashed["status"], crashed["cause"]) == ("failed", R.CRASHED, "SIGSEGV")
    assert crashed["prefill_tps"] is None and "SIGSEGV" in crashed["detail"]
    code, out = _run("trials", "--storage", real_db)
    assert code == 0 and "baseline" in out and "(SIGSEGV)" in out and "#1 failed: child killed by SIGSEGV" in out
    assert max(map(len, out.splitlines())) <= 100
    by_decode = _json("trials", "--storage", real_db, "--sort", "decode")["trials"]
    figures = [r["decode_tps"]["median"] for r in by_decode if r["decode_tps"]]
    assert figures == sorted(figures, reverse=True) and by_decode[-1]["decode_tps"] is None
    code, out = _run("trials", "--storage", real_db, "--format", "csv")
    header, *lines = out.splitlines()
    assert header.startswith("number,role,state,cause,detail,prefill_tps,prefill_cv,decode_tps,decode_cv,")
    assert len(lines) == len(rows) and lines[1].startswith("1,") and ",failed,SIGSEGV," in lines[1]


@pytest.mark.slow
def test_best_shows_front_and_measured_picks(real_db: str) -> None:
    data = _json("best", "--storage", real_db)
    complete = {r["number"] for r in _json("trials", "--storage", real_db)["trials"] if r["state"] == "complete"}
    assert data["objective"] == "pareto" and set(data["picks"]) == set(PICKS)
    for pick in data["picks"].values():
        assert pick["trials"] and set(pick["trials"]) <= complete  # each pick is a measured config
    assert data["pareto_front"] and data["recommendation"]["settings"] in [c["settings"] for c in data["pareto_front"]]
    code, out = _run("best", "--storage", real_db)
    assert code == 0 and "Recommended for" in out and "Pareto front" in out and "leanest_memory" in out


@pytest.mark.slow
def test_export_round_trip(real_db: str, tmp_path: Path) -> None:
    out = tmp_path / "rec.yaml"
    code, text = _run("export", "--storage", real_db, "-o", str(out))
    assert code == 0, text
    doc = recommend.load(out)
    assert doc["figures"]["trials"] and doc["workload"]["name"] == "tiny"
    llm = recommend.llama_from(out)
    assert llm.create_completion("Hello", max_tokens=1, temperature=0)["usage"]["completion_tokens"] == 1


@pytest.mark.slow
def test_report_of_the_real_study(real_db: str, tmp_path: Path) -> None:
    code, out = _run("report", "--storage", real_db, "-o", str(tmp_path / "r.html"), "--no-images")
    assert code == 0, out
    page = (tmp_path / "r.html").read_text()
    assert ">Machine profile</h2>" in page and 'id="plot-pareto"' in page and this_profile_name() in page


def _error(*args: str) -> str:
    code, out = _run(*args)
    assert code == 1 and out.startswith("Error: ") and out.count("\n") == 1, out
    return out


def test_user_errors(invented_db: str, tmp_path: Path) -> None:  # noqa: F811
    assert "there is no results database at" in _error("trials", "--storage", f"sqlite:///{tmp_path}/none.db")
    open_storage(f"sqlite:///{tmp_path}/empty.db")
    assert "has no results yet: run `autotune run` first" in _error("best", "--storage",
                                                                      f"sqlite:///{tmp_path}/empty.db")
    assert "unknown profile 'nope': known profiles are arm-8c, desktop-16c, laptop-4c" in \
        _error("best", "--storage", invented_db, "--profile", "nope")
    assert "2 studies of profile 'desktop-16c' match: --model SmolLM2-135M-Instruct.Q4_1 --workload chat; " \
           "--model SmolLM2-135M-Instruct.Q4_1 --workload tiny: choose one" in \
        _error("export", "--storage", invented_db, "--profile", "desktop-16c")
    assert "no study of profile 'laptop-4c' matches --workload chat: its studies are --model " \
           "SmolLM2-135M-Instruct.Q4_1 --workload tiny" in \
        _error("trials", "--storage", invented_db, "--profile", "laptop-4c", "--workload", "chat")
    assert "--from converts a recommendation file as it is" in \
        _error("export", "--storage", invented_db, "--from", "x.yaml", "--pick", "balanced")


def test_study_without_a_completed_trial(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/crashed.db"
    add_study(open_storage(url), "laptop-4c", bundled_model(), "chat", [(CHAT[0][0], {}, R.CRASHED)])
    for command in ("best", "export", "report"):
        assert "has no completed trial yet: run `autotune run` with a larger --budget" in \
            _error(command, "--storage", url, "--profile", "laptop-4c")
    code, out = _run("trials", "--storage", url, "--profile", "laptop-4c")
    assert code == 0 and "failed" in out
