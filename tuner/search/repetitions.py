"""How many timed repetitions a trial keeps where one request costs a large share of the budget.

A run asks every trial for ``--repetitions`` timed repetitions (3) after an untimed warmup. Where one
request costs tens of seconds (a 3072-token prompt on 2 vCPUs at llama.cpp's defaults: ~30 s; a 1.5B model),
three of them plus the warmup made one baseline take 170 s of a 4-minute budget, and the run measured two
configs and confirmed nothing (issue 44). So a trial's timed repetitions may take at most ``TIMED_SHARE``
of the budget in all, or ``MIN_TIMED_S`` where that is more (:func:`timed_cap_s`): its child stops repeating
once one is kept and another would pass that (:func:`tuner.backends.protocol.cap_timed`), and replaces a
disturbed one only where another fits. The
replication the median needs then comes from the confirmation stage's interleaved rounds, whose plan counts
the repetitions a trial will keep (:func:`planned`). Where repetitions are cheap nothing changes (the
bundled model's default request, 2-4 s, keeps 2-3 repetitions in a 2-minute run).

The share is sized by the confirmation stage: it needs two configs measured in two rounds within
``PAIR_RESERVE_SHARE`` (45%) of the budget, so one re-measure, load and warmup included, must stay near a
tenth of the budget; a twentieth of it for the timed repetitions leaves the rest to loading and warming up.
"""

from __future__ import annotations

TIMED_SHARE = 0.05  # the timed repetitions of one trial take at most this share of the run's budget,
MIN_TIMED_S = 10.0  # or this many seconds where that is more (a short run on a small model: nothing changes)


def timed_cap_s(budget_s: float) -> float:
    """Seconds the timed repetitions of one trial of a run with ``budget_s`` may take in all."""
    return max(TIMED_SHARE * budget_s, MIN_TIMED_S)


def planned(asked: int, rep_s: float, budget_s: float | None) -> int:
    """The timed repetitions a trial asked for ``asked`` keeps where one takes ``rep_s`` seconds (as its child
    counts them under :func:`timed_cap_s`: as many as fit, at least one); ``asked`` where ``rep_s`` or the
    budget is not known."""
    if not budget_s or rep_s <= 0 or asked <= 1:
        return asked
    return max(1, min(asked, int(timed_cap_s(budget_s) // rep_s)))
