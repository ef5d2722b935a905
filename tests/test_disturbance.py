"""A run knows how disturbed it was: a repetition during which another process took the CPU is flagged,
repeated, and left out of the figures when enough undisturbed ones remain."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tuner.measure import disturbance
from tuner.backends import protocol


def _burn(seconds: float) -> subprocess.Popen:
    """Another process keeping one CPU busy for ``seconds``."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


@pytest.mark.alone  # a real neighbour burns a CPU: nothing else may (tests/parallel.py)
def test_a_busy_neighbour_marks_the_repetition_disturbed() -> None:
    watch = disturbance.Watch()
    watch.start()
    burner = _burn(1.0)
    time.sleep(1.0)   # this process idles while the other one burns a CPU
    burner.wait()
    seen = watch.stop()
    assert seen is not None and seen["disturbed"] and seen["other_cpu_s"] >= 0.5
    assert watch.stop() is None   # a watch measures one repetition


@pytest.mark.alone  # a real neighbour burns a CPU: nothing else may (tests/parallel.py)
def test_the_protocol_replaces_a_disturbed_repetition() -> None:
    protocol._watched.clear()
    calls = {"n": 0}

    def decode(first: int, n: int) -> tuple[float, None]:
        calls["n"] += 1
        if calls["n"] == 3:   # the second timed repetition (after the warmup): another process burns a CPU
            burner = _burn(0.6)
            time.sleep(0.6)
            burner.wait()
        else:
            time.sleep(0.05)
        return 0.5 + calls["n"] / 100, None

    result = protocol.prefill_decode_reps(lambda: None, lambda toks: (0.1, 1), decode, [1, 2, 3], 8, 3, True)
    per_rep = protocol.watched()
    # The trial still reports the 3 repetitions asked for; the disturbed one was timed, then replaced.
    assert len(result["request_s"]) == len(result["prefill_tps"]) == 3
    assert per_rep[1]["disturbed"] and per_rep[1]["replaced"]
    assert per_rep[1]["phases"] == {"prefill": False, "decode": True}   # the neighbour ran during its decode
    assert 0.63 not in [round(r, 2) for r in result["request_s"]]   # its figures (0.1 s + 0.53 s) are gone
    summary = disturbance.summary(per_rep)
    assert summary["replaced"] >= 1 and summary["repetitions"] == 3 + summary["replaced"] == len(per_rep)
    protocol._watched.clear()


def test_a_trial_replaces_at_most_two_repetitions() -> None:
    rep = {"wall_s": 1.0, "other_cpu_s": 0.0, "steal_s": 0.0, "load1": 0.1, "disturbed": False, "replaced": False}
    bad = {**rep, "other_cpu_s": 0.9, "disturbed": True}
    assert disturbance.should_replace([rep], bad) and not disturbance.should_replace([rep], rep)
    replaced = {**bad, "replaced": True}
    assert not disturbance.should_replace([replaced, replaced], bad)
    per_rep = [rep, replaced, replaced, bad, rep]
    assert disturbance.summary(per_rep) == {"repetitions": 5, "disturbed": 3, "replaced": 2, "other_cpu_share": 0.54,
                                            "kept_at": [1]}  # the third disturbed one is kept, second of three
    assert disturbance.text({"repetitions": 41, "disturbed": 3, "replaced": 3}).startswith(
        "3 of 41 repetitions disturbed by other processes, 3 of them replaced by a new repetition")
    assert "Warning" in disturbance.text({"repetitions": 6, "disturbed": 2, "replaced": 0}, pick_disturbed=2)


def test_a_replaced_repetition_takes_its_depth_with_it() -> None:
    # A disturbed repetition dropped from the figures must drop its depth record too, or depth_n_past
    # (one entry per kept repetition) says five repetitions where three were kept.
    from tuner.backends.protocol import _drop_last

    figures = {"prefill_tps": [1.0, 2.0], "decode_tps": [1.0, 2.0], "ttft_s": [1.0, 2.0], "request_s": [1.0, 2.0],
               "decode_depth_tps": [1.0, 2.0], "depth_n_past": [1536, 1536]}
    _drop_last(figures)
    assert all(len(v) == 1 for v in figures.values()), figures


def _record(request_s: list[float], kept_at: list[int] | None = None, disturbed: int = 0):  # noqa: ANN202
    from tuner.measure import records as R

    section = {"repetitions": len(request_s), "disturbed": disturbed, "replaced": 0,
               **({"kept_at": kept_at} if kept_at else {})}
    return R.TrialRecord(role="search", settings={}, config_key="k", notes=(), outcome=R.TrialOutcome(status=R.OK),
                         prefill=R.Stat.of([512 / s for s in request_s]), decode=R.Stat.of([50.0] * len(request_s)),
                         request=R.Stat.of(request_s), extra={disturbance.KEY: section} if disturbed else {})


def test_a_config_rests_on_its_undisturbed_repetitions_where_it_has_any() -> None:
    # Noise runs on the Intel kind: a neighbour made one config's repetitions 2-3x slower, and it lost to
    # another engine's slow defaults. Its quiet repetitions decide; a config disturbed throughout keeps all.
    mixed = [_record([2.8, 7.9, 2.7], kept_at=[1], disturbed=1), _record([2.75, 2.8, 2.85])]
    assert disturbance.undisturbed(mixed, "request") == [2.8, 2.7, 2.75, 2.8, 2.85]
    assert disturbance.kept_disturbed(mixed) == 0
    always = [_record([7.9, 8.1], kept_at=[0, 1], disturbed=2)]
    assert disturbance.undisturbed(always, "request") == [7.9, 8.1] and disturbance.kept_disturbed(always) == 2
    older = [_record([2.8, 7.9], disturbed=1)]  # written before the positions were stored: pooled whole, counted
    assert disturbance.undisturbed(older, "request") == [2.8, 7.9] and disturbance.kept_disturbed(older) == 1


@pytest.mark.alone  # a real neighbour burns a CPU: nothing else may (tests/parallel.py)
def test_each_phase_of_a_repetition_is_watched_on_its_own() -> None:
    # A neighbour busy 2-8 s at a time disturbs nearly every 8-s repetition on a slow 2-vCPU machine
    # (grid.py --noise, older AMD EPYC: 10 of 10), but leaves many of its 3-s phases alone.
    watch = disturbance.Watch()
    watch.start()
    burner = _burn(0.8)
    time.sleep(0.8)          # the prefill: another process burns a CPU
    burner.wait()
    watch.phase("prefill")
    time.sleep(0.5)          # the decode: quiet
    watch.phase("decode")
    seen = watch.stop(("prefill", "decode"))
    assert seen is not None and seen["phases"] == {"prefill": True, "decode": False} and seen["disturbed"]
    assert seen["request_phases"] == ["prefill", "decode"]
    watch.start()
    time.sleep(0.3)
    watch.phase("decode")
    quiet = watch.stop(("prefill", "decode"))
    assert quiet is not None and quiet["phases"] == {"decode": False} and not quiet["disturbed"]


def _phased(request_s: list[float], ttft_s: list[float], busy: dict[str, list[int]],
            request_phases: tuple[str, ...] = ("prefill", "decode")):  # noqa: ANN202
    """A trial record whose repetitions' phases were watched: ``busy`` gives the disturbed positions per phase."""
    from tuner.measure import records as R

    per_rep = [{"wall_s": 1.0, "other_cpu_s": 0.0, "steal_s": 0.0, "load1": 0.0,
                "phases": {name: i in busy.get(name, ()) for name in ("prefill", "decode")},
                "request_phases": list(request_phases)} for i in range(len(request_s))]
    for d in per_rep:
        d["disturbed"] = any(d["phases"].get(name, False) for name in request_phases)
    section = disturbance.summary(per_rep)
    return R.TrialRecord(role="search", settings={}, config_key="k", notes=(), outcome=R.TrialOutcome(status=R.OK),
                         prefill=R.Stat.of([512 / s for s in ttft_s]),
                         decode=R.Stat.of([128 / (r - t) for r, t in zip(request_s, ttft_s)]),
                         ttft=R.Stat.of(ttft_s), request=R.Stat.of(request_s), extra={disturbance.KEY: section})


def test_a_request_time_is_put_together_from_quiet_phases() -> None:
    # Every repetition disturbed somewhere: the first in its prefill, the second in its decode, the third in
    # both. The quiet prefill of the second and the quiet decode of the first make one quiet request time.
    record = _phased([6.0, 9.0, 12.0], [4.0, 3.0, 5.0], {"prefill": [0, 2], "decode": [1, 2]})
    section = record.extra[disturbance.KEY]
    assert section["disturbed"] == 3 and section["kept_at"] == [0, 1, 2]
    assert section["kept_at_by_phase"] == {"prefill": [0, 2], "decode": [1, 2], "decode_depth": []}
    assert disturbance.undisturbed([record], "request") == [3.0 + (6.0 - 4.0)]
    assert disturbance.undisturbed([record], "ttft") == [3.0]
    assert disturbance.undisturbed([record], "prefill") == [round(512 / 3.0, 4)]
    assert disturbance.undisturbed([record], "decode") == [round(128 / 2.0, 4)]
    assert disturbance.kept_disturbed([record]) == 0   # the pick's request time rests on quiet phases only
    # A repetition quiet throughout counts as it is; with no quiet prefill at all, every request is kept.
    quiet_one = _phased([6.0, 9.0], [4.0, 3.0], {"decode": [1]})
    assert disturbance.undisturbed([quiet_one], "request") == [6.0]
    busy = _phased([6.0, 9.0], [4.0, 3.0], {"prefill": [0, 1]})
    assert disturbance.undisturbed([busy], "request") == [6.0, 9.0] and disturbance.kept_disturbed([busy]) == 2


def test_the_noisy_machine_no_longer_crowns_the_config_least_hurt_by_the_noise() -> None:
    # grid.py --noise on the older AMD EPYC, 2 vCPUs: one thread decodes while the neighbour holds the
    # other CPU; two threads wait for it (decode 14 t/s instead of 47). Judged on whole repetitions, all
    # disturbed, the one-thread defaults won a 2-minute run. Judged on quiet phases, two threads win.
    from tuner.selection import decision
    from tuner.selection.candidates import _pooled

    one_thread = _phased([8.1, 8.3, 8.2], [4.3, 4.4, 4.3], {"prefill": [0, 1, 2], "decode": [0, 1, 2]})
    # Each repetition disturbed in one phase: quiet prefills ~3.0 s, quiet decodes ~2.7 s, busy ones 1.5-3x.
    two_threads = _phased([12.0, 7.3, 12.1, 7.4, 11.8, 7.2], [3.1, 4.6, 3.0, 4.7, 3.0, 4.5],
                          {"prefill": [1, 3, 5], "decode": [0, 2, 4]})

    a, b = _pooled("two", [(0, two_threads, False)]), _pooled("one", [(1, one_thread, False)])  # as the run pools them
    assert a.request.samples == (5.8, 5.7, 5.7) and b.request.median == 8.2
    assert decision.compare(a, b, "request_time").verdict == decision.BETTER


@pytest.mark.alone  # a real neighbour burns a CPU: nothing else may (tests/parallel.py)
def test_after_a_busy_moment_the_next_repetition_waits_for_a_quiet_machine() -> None:
    # A neighbour busy in bursts (grid.py --noise: 2-8 s on, 2-8 s off) disturbs a repetition started during
    # a burst; waiting for the burst to end measures the next one in the quiet that follows.
    burner = _burn(1.2)
    time.sleep(0.1)
    waited = disturbance.wait_for_quiet(5.0)
    burner.wait()
    assert 1.0 <= waited < 4.0, waited           # until the burst ended, then two quiet looks
    assert disturbance.wait_for_quiet(5.0) < 1.0   # a quiet machine: the two looks alone
    burner = _burn(3.0)
    time.sleep(0.1)
    assert disturbance.wait_for_quiet(0.6) < 1.0   # a machine that stays busy: no longer than asked
    burner.kill()
    burner.wait()
    # Only a disturbed repetition (or warmup) makes the next one wait, and a trial waits 20 s at most.
    quiet, busy = {"disturbed": False}, {"disturbed": True}
    assert disturbance.wait_left([]) == disturbance.wait_left([busy, quiet]) == 0.0
    assert disturbance.wait_left([busy]) == disturbance.MAX_WAIT_S
    assert disturbance.wait_left([{**busy, "waited_s": 15.0}, busy]) == 5.0
    assert disturbance.wait_left([{**busy, "waited_s": 8.0}, {**busy, "waited_s": 12.0}, busy]) == 0.0
    assert "20 s waited for the machine to quiet down" in disturbance.text(
        {"repetitions": 9, "disturbed": 4, "replaced": 2, "waited_s": 20.2})


@pytest.mark.alone  # a real neighbour burns a CPU: nothing else may (tests/parallel.py)
def test_the_protocol_waits_after_a_disturbed_warmup_and_a_disturbed_repetition() -> None:
    protocol._watched.clear()
    calls = {"n": 0}

    def decode(first: int, n: int) -> tuple[float, None]:
        calls["n"] += 1
        if calls["n"] in (1, 3):   # the warmup and the second timed repetition: another process burns a CPU
            burner = _burn(0.6)
            time.sleep(0.6)
            burner.wait()
        else:
            time.sleep(0.05)
        return 0.5, None

    protocol.prefill_decode_reps(lambda: None, lambda toks: (0.1, 1), decode, [1, 2, 3], 8, 3, True)
    per_rep = protocol.watched()
    assert per_rep[0].get("waited_s", 0) >= 0.5     # the first timed repetition waited after the busy warmup
    assert per_rep[1]["disturbed"] and per_rep[2].get("waited_s", 0) >= 0.5  # ... and the one after the busy one
    assert not per_rep[1].get("waited_s")            # after a quiet repetition nothing waits
    assert disturbance.summary(per_rep)["waited_s"] >= 1.0
    protocol._watched.clear()


@pytest.mark.alone  # needs every CPU: it pins itself to one and burns another
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: one to watch, one for the neighbour")
def test_a_process_pinned_to_some_cpus_is_disturbed_only_by_what_runs_on_them() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    mine, other = allowed[0], allowed[1]
    pinned_burn = ("import os, time\nos.sched_setaffinity(0, {%d})\nend = time.monotonic() + 1.0\n"
                   "while time.monotonic() < end: pass\n")
    try:
        os.sched_setaffinity(0, {mine})
        seen = {}
        for cpu in (other, mine):
            watch = disturbance.Watch()
            watch.start()
            subprocess.run([sys.executable, "-c", pinned_burn % cpu], check=True)
            seen[cpu] = watch.stop()
    finally:
        os.sched_setaffinity(0, set(allowed))
    assert not seen[other]["disturbed"] and seen[other]["other_cpu_s"] < 0.5, seen   # a neighbour elsewhere
    assert seen[mine]["disturbed"] and seen[mine]["other_cpu_s"] >= 0.5, seen         # a neighbour on its CPU
