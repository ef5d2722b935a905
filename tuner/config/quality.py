"""The quality limits a run may set on the weights it measures, as the CLI reads them: ``--max-quality-loss``
(perplexity, a fraction of the source's) and ``--max-kl`` (mean KL divergence from the source, nats per token).
The backend that makes weight variants measures them (its ``quality`` capability)."""

from __future__ import annotations

from ..errors import AutotuneError
from ..util.units import parse_fraction

# --max-kl default, in nats: see the README's "Quality: KL divergence" section for the figures
# measured on the bundled SmolLM2-135M that put it between Q4_K_M and Q4_0 made from the shipped Q4_1.
DEFAULT_MAX_KL = 0.10


def parse_max_kl(text: str | float | None) -> float | None:
    """``--max-kl`` in nats per token: "0.1" -> 0.1, "none" -> None; AutotuneError otherwise."""
    if text is None or str(text).strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise AutotuneError(f"cannot read --max-kl {text!r}: give nats per token such as 0.1, or 'none'") from None
    if not value >= 0:
        raise AutotuneError(f"--max-kl must be 0 or more, not {text!r}")
    return value


def parse_max_loss(text: str | float) -> float:
    """``--max-quality-loss`` as a fraction: "5%" -> 0.05, "0.05" -> 0.05; AutotuneError otherwise."""
    return parse_fraction(text, "--max-quality-loss")
