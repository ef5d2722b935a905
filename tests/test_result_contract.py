"""The child's result is one typed, versioned contract (:class:`tuner.measure.records.TrialResult`): the child
writes it, the parent reads it, and a result the parent cannot read is the trial's recorded error."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.backends import child
from tuner.measure import records as R
from tuner.measure import runner

WRITTEN = {"ok": True, "prefill_tps": [500.0, 520.0], "decode_tps": [90.0, 95.0], "ttft_s": [0.1, 0.1],
           "request_s": [1.0, 1.1], "prompt_tokens": 64, "generate_tokens": 16, "timed_s": 2.1, "load_s": 0.4,
           "repacked_mib": 12.5, "n_ctx": 512, "disturbance": [{"disturbed": False}],
           "memory": {"peak_rss": 100, "peak_anon": 60, "peak_file": 40}}


def test_a_result_reads_back_as_written_its_engine_facts_kept() -> None:
    result = R.TrialResult.read(WRITTEN)
    assert result.ok and result.repetitions == 2 and result.memory == R.Memory(100, 60, 40)
    assert result.public() == {"version": R.RESULT_VERSION, **WRITTEN}   # n_ctx: an engine's own fact, kept
    assert R.TrialResult.read(result.public()) == result


def test_a_result_without_a_version_is_one_written_before_it_had_one() -> None:
    assert R.TrialResult.read({"ok": True, "prefill_tps": [1.0]}).version == 1


@pytest.mark.parametrize("data, words", [
    ({"version": R.RESULT_VERSION + 1, "ok": True}, "newer autotune"),
    ({"ok": True, "prefill_tps": "fast"}, "malformed"),
    ({"ok": True, "memory": {"peak_rss": "lots"}}, "malformed"),
    ([1, 2], "JSON object"),
])
def test_a_result_this_autotune_cannot_read_is_said_so(data: object, words: str) -> None:
    with pytest.raises(R.ResultError, match=words):
        R.TrialResult.read(data)


def _outcome_of(tmp_path: Path, written: object, code: int = 0) -> R.TrialOutcome:
    """The runner's outcome of a child that exited with ``code`` after writing ``written``."""
    (tmp_path / "result.json").write_text(json.dumps(written))
    watch = SimpleNamespace(peak=R.Memory(peak_rss=50), status=None, reason="")
    return runner._outcome(tmp_path, SimpleNamespace(returncode=code), watch, 1.0)  # type: ignore[arg-type]


def test_the_parent_keeps_a_readable_result_and_records_an_unreadable_one_as_an_error(tmp_path: Path) -> None:
    good = _outcome_of(tmp_path, WRITTEN)
    assert good.status == R.OK and good.result == {"version": R.RESULT_VERSION, **WRITTEN}
    assert good.memory.peak_rss == 100 and good.measured() == R.TrialResult.read(WRITTEN)
    newer = _outcome_of(tmp_path, {**WRITTEN, "version": R.RESULT_VERSION + 1})
    assert newer.status == R.ERROR and "newer autotune" in newer.reason and newer.result is None
    broken = _outcome_of(tmp_path, {**WRITTEN, "decode_tps": {"median": 90}})
    assert broken.status == R.ERROR and "malformed" in broken.reason and not broken.ok
    failed = _outcome_of(tmp_path, {"ok": False, "error": "RuntimeError: boom"}, code=2)
    assert failed.status == R.ERROR and failed.reason == "RuntimeError: boom"


def test_the_child_writes_a_result_that_fits_or_says_why_not() -> None:
    memory = {"peak_rss": 10, "peak_anon": 5, "peak_file": 5}
    fits = child._checked({"ok": True, "prefill_tps": [1.0]}, memory)
    assert fits.ok and fits.memory == R.Memory(10, 5, 5) and fits.public()["version"] == R.RESULT_VERSION
    odd = child._checked({"ok": True, "prefill_tps": ["quick"]}, memory)
    assert not odd.ok and "does not fit" in (odd.error or "") and odd.memory == R.Memory(10, 5, 5)


def test_older_records_still_read() -> None:
    """A record stored before the result had a version keeps its plain result; its figures read as before."""
    old = {"v": 4, "role": "search", "settings": {"n_ctx": 256}, "config_key": "k", "notes": [],
           "outcome": {"status": "ok", "memory": {"peak_rss": 1}, "result": {"ok": True, "prefill_tps": [1.0]}},
           "prefill": {"median": 1.0, "cv": 0.0, "min": 1.0, "max": 1.0, "n": 1, "samples": [1.0]}}
    record = R.TrialRecord.from_dict(old)
    assert record.outcome.ok and record.outcome.measured().prefill_tps == [1.0] and record.prefill.median == 1.0
