"""The cells of autotune's tables: measured figures as short text."""

from __future__ import annotations

from typing import Any


def stat(figure: dict[str, Any] | None, unit: str = "") -> str:
    """A measured figure: its median, spread and count (``12.3 ±4% (n=3)``)."""
    if not figure:
        return "-"
    return f"{figure['median']:.1f}{unit} ±{figure['cv'] * 100:.0f}% (n={figure['n']})"


def seconds(figure: dict[str, Any] | None) -> str:
    """A measured time in seconds: its median, spread and count."""
    if not figure:
        return "-"
    return f"{figure['median']:.2f} s ±{figure['cv'] * 100:.0f}% (n={figure['n']})"


def num(value: float | None, fmt: str = "{:.1f}") -> str:
    """A number, or ``-`` when there is none."""
    return "-" if value is None else fmt.format(value)
