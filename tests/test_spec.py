"""The typed spec a trial's child is told to measure (tuner/measure/spec.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from tuner.backends.settings import TrialSettings
from tuner.config.workloads import get_workload
from tuner.measure.spec import SPEC_VERSION, TrialSpec


def test_a_spec_round_trips_through_the_file_the_child_reads(tmp_path: Path) -> None:
    spec = TrialSpec.of("/models/m.gguf", TrialSettings(n_threads=2), get_workload("tiny"), 3, fault="crash")
    runner = spec.with_runner(1234, tmp_path / "progress.json")
    (tmp_path / "spec.json").write_text(runner.model_dump_json())
    back = TrialSpec.read(tmp_path / "spec.json")
    assert back == runner and back.version == SPEC_VERSION
    assert back.backend == "llama_cpp" and back.settings["n_threads"] == 2
    assert back.parent_pid == 1234 and back.progress_path == str(tmp_path / "progress.json")
    assert back.warmup is True and back.adaptive is None and back.workload.name == "tiny"
    assert json.loads((tmp_path / "spec.json").read_text())["version"] == SPEC_VERSION


def test_a_dict_spec_is_validated_and_a_misspelt_field_refused() -> None:
    fields = {"model_path": "m.gguf", "settings": TrialSettings().model_dump(),
              "workload": get_workload("tiny").model_dump(), "repetitions": 2}
    assert TrialSpec.coerce(fields).repetitions == 2
    with pytest.raises(pydantic.ValidationError):
        TrialSpec.coerce({**fields, "repetiton": 3})   # a typo never passes silently to the child
    with pytest.raises(pydantic.ValidationError):
        TrialSpec.coerce({**fields, "repetitions": 0})


def test_a_trials_role_is_an_enum_that_stores_and_compares_as_its_plain_value() -> None:
    import yaml

    from tuner.measure import records as R
    from tuner.util.yamlio import dump_yaml

    record = R.TrialRecord(role=R.Role.REMEASURE, settings={}, config_key="k", notes=(),
                           outcome=R.TrialOutcome(status=R.OK))
    stored = json.loads(json.dumps(record.public()))
    assert stored["role"] == "remeasure"
    back = R.TrialRecord.from_dict(stored)
    assert back.role is R.Role.REMEASURE and back.role == "remeasure" and str(back.role) == "remeasure"
    assert yaml.safe_load(dump_yaml({"role": back.role})) == {"role": "remeasure"}
    assert R.TrialRecord.from_dict({**stored, "role": "lucky"}).role == "lucky"  # a newer version's role: kept
