"""Learning-rate schedule: linear warmup from zero, then cosine decay to a floor.

    lr_multiplier(step=0, warmup_steps=10, total_steps=100, min_ratio=0.1)   # 0.1 of peak
"""

from __future__ import annotations

import math


def lr_multiplier(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Fraction of the peak learning rate used for optimizer step `step` (0-based).

    Warmup reaches the peak at the end of step `warmup_steps - 1`; the cosine then falls from
    the peak to `min_ratio` by the last step.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * cosine
