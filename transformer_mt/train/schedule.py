"""The paper's learning rate: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)."""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR


def inverse_sqrt_lr(step: int, *, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """Learning rate of update number `step` (1-based): linear warm-up, then step^-0.5 decay."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def paper_schedule(
    optimizer: torch.optim.Optimizer, *, d_model: int, warmup_steps: int, scale: float
) -> LambdaLR:
    """LambdaLR over a base lr of 1.0: the optimizer's lr for update k is inverse_sqrt_lr(k).

    LambdaLR calls the function with the number of scheduler steps taken so far (0 before the
    first update), so update k (1-based) uses lambda(k - 1) and we pass k = count + 1.
    """
    for group in optimizer.param_groups:
        group["lr"] = 1.0
        group["initial_lr"] = 1.0
    return LambdaLR(
        optimizer,
        lambda count: inverse_sqrt_lr(
            count + 1, d_model=d_model, warmup_steps=warmup_steps, scale=scale
        ),
    )
