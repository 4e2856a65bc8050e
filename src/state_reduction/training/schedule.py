"""Learning-rate schedules shared by pretraining (training.pretrain) and recovery fine-tuning (rft.trainer)."""

from __future__ import annotations

import math


def warmup_cosine(step: int, steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """The multiplier of step `step` (0-based) of `steps`: linear warm-up over `warmup_steps`, then cosine from 1
    to `min_lr_ratio` at the last step."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
