"""The suite's parallel run keeps each ``xdist_group`` on one worker (tests/parallel.py relies on it: the ``alone``
chain, module fixtures built once such as tests/test_cli_results.py's tuned database)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("parallel_self_test")


def test_a_grouped_test_is_scheduled_by_its_group(request: pytest.FixtureRequest) -> None:
    """pytest-xdist's ``--dist loadgroup`` schedules by the group it appends to a grouped test's id; when that
    append stops working (pytest 9.2 with pytest-xdist 3.8), every grouped test is scheduled alone, silently."""
    if not request.config.getoption("loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@parallel_self_test"), request.node.nodeid
