"""The machine profile: detected facts, its fingerprint, and the measured memory bandwidth."""

from __future__ import annotations

import os

import pytest

from tuner.machine.profile import bandwidth_for_threads, detect_profile, measure_memory_bandwidth


@pytest.mark.all_cpus  # needs every CPU, measures nothing a neighbour disturbs (tests/parallel.py)
def test_profile_records_the_allowed_cpus_and_a_stable_id() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    full = detect_profile()
    assert full.cpus == allowed and full.n_cpus == len(allowed)
    assert detect_profile().id == full.id  # the fingerprint is stable
    try:
        one = detect_profile(cpus=[allowed[0]])  # narrows this process, as `autotune run --cpus` does
        assert one.cpus == [allowed[0]] == sorted(os.sched_getaffinity(0))
    finally:
        os.sched_setaffinity(0, allowed)
    if len(allowed) > 1:
        assert one.id != full.id and one.name != full.name


@pytest.mark.all_cpus  # needs every CPU, measures nothing a neighbour disturbs (tests/parallel.py)
def test_measured_bandwidth_is_plausible() -> None:
    one = measure_memory_bandwidth(size_mb=64, runs=3)
    # Any machine that runs an LLM streams between 0.5 and 1000 GB/s from DRAM.
    assert 0.5 < one < 1000
    if len(os.sched_getaffinity(0)) > 1:
        assert measure_memory_bandwidth(size_mb=64, runs=3, threads=2) > 0.5


@pytest.mark.parametrize(("one", "all_cpus", "threads", "expected"), [
    (10.0, 25.0, 1, 10.0),      # one thread: one core's bound
    (10.0, 25.0, 2, 20.0),      # two threads: linear while under the all-CPU figure
    (10.0, 25.0, 8, 25.0),      # many threads: capped by what all CPUs pull together
    (10.0, None, 4, 10.0),      # older profile without the all-CPU figure
    (10.0, 8.0, 4, 10.0),       # a disturbed all-CPU measurement never lowers the bound below one thread
    (None, 25.0, 2, None),      # nothing measured: no roofline
])
def test_bandwidth_for_threads(one, all_cpus, threads, expected) -> None:
    assert bandwidth_for_threads(one, all_cpus, threads) == expected
