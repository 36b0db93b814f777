"""Learning-rate schedule: linear warmup from zero, then cosine decay to a floor.

    lr_multiplier(step=0, warmup_steps=10, total_steps=100, min_ratio=0.1)   # 0.1 of peak
"""

from __future__ import annotations

import math

from raytrain.spec import TrainingSpec


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


def peak_learning_rate(training: TrainingSpec) -> float:
    """The spec's learning_rate after its lr_scaling rule, for its global batch."""
    return training.learning_rate * lr_batch_scale(
        training.lr_scaling, training.global_batch_size, training.lr_reference_batch_size)


def lr_batch_scale(rule: str, global_batch_size: int, reference_batch_size: int | None) -> float:
    """Learning-rate factor for a global batch other than the one the rate was tuned for.

    'linear' (Goyal et al., 2017) keeps the update per sample constant; 'sqrt' keeps the
    gradient noise constant (Krizhevsky, 2014; Hoffer et al., 2017), the gentler choice for
    Adam-family optimizers. Both are meant to be used with warmup.

        lr_batch_scale("sqrt", 1024, 256)   # 2.0
    """
    if rule == "none" or reference_batch_size is None:
        return 1.0
    ratio = global_batch_size / reference_batch_size
    if rule == "linear":
        return ratio
    if rule == "sqrt":
        return math.sqrt(ratio)
    raise ValueError(f"unknown lr scaling rule {rule!r}")
