"""The composite config: the best decode settings and the best prefill settings of the same weights.

Every trial measures both prefill and decode, and in llama.cpp they depend on different settings
(decode on ``n_threads``, prefill on ``n_threads_batch`` and the batch sizes; a backend names them
in ``figure_settings``). The config that decodes fastest and the one that prefills fastest are
often different trials; their combination may beat both on the request time, yet it is only a
guess until measured. :func:`propose` builds it from the measured configs; the search measures it
like any other config (role ``composite``) before it can be recommended.
"""

from __future__ import annotations

from typing import Any

from .. import backends
from ..selection import decision, candidates as select
from ..backends.settings import TrialSettings, config_key, normalize

NOTE = ("composite: the best config's weights with the decode settings of its fastest-decoding and the "
        "prefill settings of its fastest-prefilling relative, measured like any other config")


def _same_weights(a: select.Candidate, b: select.Candidate, apart: set[str]) -> bool:
    """Whether ``a`` and ``b`` differ in nothing but the figure-specific settings ``apart``."""
    keys = (set(a.settings) | set(b.settings)) - apart
    return all(a.settings.get(k) == b.settings.get(k) for k in keys)


def propose(cands: list[select.Candidate], objective: str, tried: set[str] = frozenset()) -> TrialSettings | None:
    """The composite of the best config: its settings, with each figure's own settings taken from the
    config of the same weights and shared settings that measured that figure fastest. None when
    there is nothing to combine (a backend without figure settings, or the combination is a config
    already measured or in ``tried``)."""
    best = decision.best(cands, objective)
    if best is None:
        return None
    split = backends.get(best.backend).figure_settings
    apart = {name for names in split.values() for name in names}
    if not apart:
        return None
    pool = [c for c in cands if c.backend == best.backend and _same_weights(c, best, apart)]
    settings: dict[str, Any] = dict(best.settings)
    for figure, names in split.items():
        fastest = max(pool, key=lambda c: getattr(c, figure).median)
        settings.update({name: fastest.settings[name] for name in names if name in fastest.settings})
    composite, _ = normalize(TrialSettings(**settings))
    measured = {c.config_key for c in cands} | set(tried)
    return None if config_key(composite) in measured else composite
