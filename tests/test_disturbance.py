"""A run knows how disturbed it was: a repetition during which another process took the CPU is flagged,
repeated, and left out of the figures when enough undisturbed ones remain."""

from __future__ import annotations

import subprocess
import sys
import time

from tuner.measure import disturbance
from tuner.backends import protocol


def _burn(seconds: float) -> subprocess.Popen:
    """Another process keeping one CPU busy for ``seconds``."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_busy_neighbour_marks_the_repetition_disturbed() -> None:
    watch = disturbance.Watch()
    watch.start()
    burner = _burn(1.0)
    time.sleep(1.0)   # this process idles while the other one burns a CPU
    burner.wait()
    seen = watch.stop()
    assert seen is not None and seen["disturbed"] and seen["other_cpu_s"] >= 0.5
    assert watch.stop() is None   # a watch measures one repetition


def test_the_protocol_repeats_a_disturbed_repetition_and_keeps_the_figures_clean() -> None:
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
        return 0.5, None

    result = protocol.prefill_decode_reps(lambda: None, lambda toks: (0.1, 1), decode, [1, 2, 3], 8, 3, True)
    per_rep = protocol.watched()
    reps = len(result["request_s"])
    assert per_rep[1]["disturbed"]
    assert 3 < reps <= 3 + disturbance.MAX_REPEATS and len(per_rep) == reps
    result[disturbance.KEY] = per_rep
    clean, summary = disturbance.without_disturbed(result)
    assert summary["disturbed"] >= 1 and summary["repetitions"] == reps
    if reps - summary["disturbed"] >= disturbance.MIN_CLEAN:
        assert summary["dropped"] == summary["disturbed"]
        assert len(clean["request_s"]) == reps - summary["disturbed"] == len(clean["prefill_tps"])
    protocol._watched.clear()


def test_disturbed_samples_are_dropped_only_when_enough_clean_ones_remain() -> None:
    rep = {"wall_s": 1.0, "other_cpu_s": 0.0, "steal_s": 0.0, "load1": 0.1, "disturbed": False}
    bad = {**rep, "other_cpu_s": 0.9, "disturbed": True}
    result = {"request_s": [2.0, 6.4, 2.1, 2.0], "decode_tps": [50, 20, 49, 50], "prompt_tokens": 512,
              disturbance.KEY: [rep, bad, rep, rep]}
    clean, summary = disturbance.without_disturbed(result)
    assert clean["request_s"] == [2.0, 2.1, 2.0] and clean["decode_tps"] == [50, 49, 50]
    assert summary == {"repetitions": 4, "disturbed": 1, "dropped": 1, "other_cpu_share": 0.225}
    few = {"request_s": [2.0, 6.4], disturbance.KEY: [rep, bad]}
    kept, summary = disturbance.without_disturbed(few)
    assert kept is few and summary["dropped"] == 0
    assert disturbance.repeats([rep, bad]) == 1 and disturbance.repeats([bad, bad, bad]) == disturbance.MAX_REPEATS
    assert disturbance.text({"repetitions": 41, "disturbed": 3, "dropped": 3}).startswith(
        "3 of 41 repetitions disturbed by other processes, 3 replaced")
    assert "Warning" in disturbance.text({"repetitions": 6, "disturbed": 2, "dropped": 0}, pick_disturbed=2)
