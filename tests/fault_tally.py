"""A pytest plugin: the fault-injection figures the suite prints at its end (faults injected, survived,
trials lost), summed over every pytest-xdist worker.

Each worker counts in its own :data:`TALLY`; a worker hands its counts to the controlling process when it
finishes (xdist's ``workeroutput``), and the controller prints the sum. Without xdist the one process
counts and prints.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

KEY = "autotune_fault_tally"


class FaultTally:
    """Faults injected, faults survived (every check after the fault passed), trials lost."""

    def __init__(self) -> None:
        self.injected: list[str] = []
        self.survived: list[str] = []
        self.trials_lost = 0

    def add(self, counts: dict[str, Any]) -> None:
        """Add a worker's counts."""
        self.injected += counts["injected"]
        self.survived += counts["survived"]
        self.trials_lost += counts["trials_lost"]


TALLY = FaultTally()


@contextlib.contextmanager
def fault(name: str) -> Iterator[None]:
    """Count ``name`` as injected, and as survived if the block's checks all pass."""
    TALLY.injected.append(name)
    yield
    TALLY.survived.append(name)


def counted(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A test as one injected fault: counted as survived when it passes."""
    def wrap(test: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> Any:
            with fault(name):
                return test(*args, **kwargs)
        return run
    return wrap


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker hands its counts to the controller."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput[KEY] = {"injected": TALLY.injected, "survived": TALLY.survived,
                                            "trials_lost": TALLY.trials_lost}


def pytest_testnodedown(node: Any, error: Any) -> None:
    """The controller adds a finished worker's counts (an xdist hook, called only where xdist runs)."""
    counts = getattr(node, "workeroutput", {}).get(KEY)
    if counts:
        TALLY.add(counts)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the figures at the end of the session."""
    if not TALLY.injected:
        return
    terminalreporter.section("fault injection")
    terminalreporter.write_line(f"faults injected: {len(TALLY.injected)}")
    terminalreporter.write_line(f"faults survived: {len(TALLY.survived)}")
    terminalreporter.write_line(f"trials lost:     {TALLY.trials_lost}")
    missed = [name for name in TALLY.injected if name not in TALLY.survived]
    if missed:
        terminalreporter.write_line(f"not survived:    {', '.join(missed)}")
