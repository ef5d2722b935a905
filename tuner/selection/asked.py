"""What a run asked of its pick, stored with its study: its targets and its memory ceiling (issue 41).

A run's recommendation file is chosen by :func:`tuner.selection.decision.best` under the run's targets
(``--min-decode``, ``--min-prefill``, ``--max-memory``) and its memory ceiling (``--memory-ceiling``, or
75% of the memory available when it started). Everything else that names a study's config (``autotune
best``, ``export``, ``tuner.autoconfig()``, ``tuner.load()``, ``autotune serve`` and the warm start of
another machine) reads them back from the study with :meth:`Asked.of` and asks the same rule through
:meth:`Asked.best`, so every one of them names the config the file names.

Both are study user attributes: the targets under :data:`tuner.selection.targets.TARGETS_ATTR` (since
issue 29) and the ceiling, in bytes, under :data:`CEILING_ATTR`. A study stored before either existed
lacks the attribute and is read as having none (no target, no ceiling), as it was chosen then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import AutotuneError
from . import decision
from ..results.studies import OptunaError, Study
from .candidates import Candidate
from .targets import Targets

CEILING_ATTR = "autotune_memory_ceiling"  # study user attribute: the latest run's memory ceiling, in bytes


@dataclass(frozen=True)
class Asked:
    """The targets and memory ceiling a study's pick is made under (None: none)."""

    targets: Targets | None = None
    ceiling: int | None = None

    @classmethod
    def of(cls, attrs: dict[str, Any]) -> "Asked":
        """What the latest run of a study (its user attributes ``attrs``) asked; nothing for an older study."""
        ceiling = attrs.get(CEILING_ATTR)
        return cls(targets=Targets.from_attrs(attrs), ceiling=int(ceiling) if ceiling else None)

    def best(self, cands: list[Candidate], objective: str, among: Callable[[Candidate], bool] | None = None
             ) -> Candidate | None:
        """The one decision rule's pick of ``cands`` under these targets and ceiling (None: nothing qualifies)."""
        return decision.best(cands, objective, among=among, ceiling=self.ceiling, targets=self.targets)

    def with_ceiling(self, ceiling: int | None) -> "Asked":
        """The same targets under ``ceiling`` instead (None: the stored one)."""
        return self if ceiling is None else Asked(self.targets, ceiling)


def store_ceiling(study: Study, ceiling: int | None) -> None:
    """Keep a run's memory ceiling on its ``study`` (a convenience: a database that refuses it is no failure)."""
    with contextlib.suppress(OptunaError, AutotuneError):
        study.set_user_attr(CEILING_ATTR, int(ceiling) if ceiling else None)
