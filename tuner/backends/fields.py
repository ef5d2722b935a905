"""How a backend declares the settings it adds to :class:`tuner.backends.settings_model.TrialSettings`: each
backend's ``fields`` module maps a setting name to (its type, :func:`setting`)."""

from __future__ import annotations

from typing import Any

SMALLEST = "<the smallest value the space allows>"
LARGEST = "<the largest value the space allows>"


def setting(default: Any, description: str, **bounds: Any) -> dict[str, Any]:
    """A field of the settings model: its default, a description and pydantic bounds (``ge``, ``le``)."""
    return {"default": default, "description": description, **bounds}
