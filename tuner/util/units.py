"""Parsing and printing of durations and byte sizes given on the command line."""

from __future__ import annotations

import re

from ..errors import AutotuneError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h|hr)?\s*$", re.IGNORECASE)
_DURATION_FACTORS = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_FACTORS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
                 "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


def parse_duration(text: str | float | int) -> float:
    """Seconds in ``text`` such as ``90s``, ``30m``, ``1h`` or ``45`` (seconds); must be > 0."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text))
        if not match:
            raise AutotuneError(f"cannot read the duration {text!r}: write it like 90s, 30m or 1h")
        seconds = float(match.group(1)) * _DURATION_FACTORS[(match.group(2) or "s").lower()]
    if seconds <= 0:
        raise AutotuneError(f"the duration {text!r} must be more than zero, e.g. 2m")
    return seconds


def parse_size(text: str | int) -> int:
    """Bytes in ``text`` such as ``4GiB``, ``512MB`` or ``1000000``; must be > 0."""
    if isinstance(text, int):
        size = text
    else:
        match = _SIZE.match(str(text))
        if not match:
            raise AutotuneError(f"cannot read the size {text!r}: write it like 4GiB or 512MB")
        unit = (match.group(2) or "").lower().rstrip("b")
        size = int(float(match.group(1)) * _SIZE_FACTORS[unit])
    if size <= 0:
        raise AutotuneError(f"the size {text!r} must be more than zero, e.g. 4GiB")
    return size


def format_bytes(n: float | None) -> str:
    """``1.5 GiB`` style text for a byte count."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """``2m05s`` style text for a number of seconds."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def parse_fraction(text: str | float, option: str) -> float:
    """A percentage or fraction given to ``option``: "5%" -> 0.05, "0.05" -> 0.05; AutotuneError otherwise."""
    raw = str(text).strip()
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(%?)", raw)
    if not match:
        raise AutotuneError(f"{option} {raw!r} is not a percentage or fraction: write e.g. 5% or 0.05")
    value = float(match.group(1)) / (100.0 if match.group(2) else 1.0)
    if value >= 1.0 and not match.group(2):
        raise AutotuneError(f"{option} {raw!r} is ambiguous: write {raw}% or a fraction below 1")
    return value
