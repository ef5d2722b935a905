"""How large each GGUF weight type is, so the search can try the nearest weight type first.

The weight type is an ordered setting: every type reads a share of the float weights' bytes per token,
and neighbouring types differ least in speed and quality. Local refinement (:mod:`tuner.search.refine`)
changes one setting at a time around the best config; for the weight type it tries the types nearest in
size first (from Q8_0: Q6_K, then Q5_K_M, ...), as it tries the adjacent thread counts first, instead of the
search space file's order, which would measure the far end of the list before the next step down.

The sizes are those llama.cpp's ``llama-quantize --help`` prints for Llama-3-8B (GB; 8.03 B weights), which
include the tensors each mix keeps at higher precision; types it lists in bits per weight are converted.
Only the order they give matters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

LLAMA3_8B_WEIGHTS = 8.03e9


def _gb(bits_per_weight: float) -> float:
    return bits_per_weight * LLAMA3_8B_WEIGHTS / 8 / 1e9


LLAMA3_8B_GB: dict[str, float] = {
    "F32": 26.00, "F16": 14.00, "BF16": 14.00, "Q8_0": 7.96, "Q6_K": 6.14, "Q5_1": 5.65, "Q5_K_M": 5.33,
    "Q5_K_S": 5.21, "Q5_0": 5.21, "Q4_1": 4.78, "Q4_K_M": 4.58, "Q4_K_S": 4.37, "Q4_0": 4.34,
    "IQ4_NL": _gb(4.50), "IQ4_XS": _gb(4.25), "Q3_K_L": 4.03, "Q3_K_M": 3.74, "Q3_K_S": 3.41,
    "IQ3_M": _gb(3.66), "IQ3_S": _gb(3.44), "IQ3_XS": _gb(3.3), "IQ3_XXS": _gb(3.06), "Q2_K": 2.96,
    "Q2_K_S": 2.96, "IQ2_M": _gb(2.7), "IQ2_S": _gb(2.5), "IQ2_XS": _gb(2.31), "IQ2_XXS": _gb(2.06),
    "IQ1_M": _gb(1.75), "IQ1_S": _gb(1.56), "TQ2_0": _gb(2.06), "TQ1_0": _gb(1.69),
}


def relative_size(weight_type: Any) -> float | None:
    """The size of ``weight_type`` (a quant name, any case) against the others, or None where it is not
    known ("source", whose type depends on the file, or a name llama.cpp added later)."""
    return LLAMA3_8B_GB.get(str(weight_type).upper())


def nearest_first(current: Any, others: Sequence[Any]) -> list[Any]:
    """``others`` ordered by how far their size is from ``current``'s (ratio, so one step down and one step
    up weigh alike), nearest first; types of unknown size, or all of them where ``current``'s is unknown,
    keep their order after the known ones."""
    here = relative_size(current)
    if here is None:
        return list(others)
    known = [v for v in others if relative_size(v) is not None]
    rest = [v for v in others if relative_size(v) is None]
    return sorted(known, key=lambda v: abs(math.log(relative_size(v) / here))) + rest  # type: ignore[operator]
