"""Interleaved rounds, the one way autotune measures configs side by side: every config once per round,
every other round in reverse order (A B C, C B A, A B C, ...), so a drift in the machine's speed over the
minutes of measuring falls on every config alike instead of deciding between close ones.

The confirmation stage (:mod:`tuner.search.remeasure`), ``autotune check`` (:mod:`tuner.recommend.check`)
and the benchmarks' side-by-side re-measurements (``benchmarks/common.interleave``) all order their trials here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def round_order(items: Sequence[T], number: int) -> list[T]:
    """The order of round ``number`` (from 0): as given in even rounds, reversed in odd ones."""
    return list(items) if number % 2 == 0 else list(items)[::-1]


def interleaved(items: Sequence[T], rounds: int) -> Iterator[tuple[int, T]]:
    """(round number, item) for ``rounds`` interleaved rounds over ``items``."""
    for number in range(rounds):
        for item in round_order(items, number):
            yield number, item
