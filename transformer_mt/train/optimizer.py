"""The optimizer side of an update: the paper's Adam under its learning-rate schedule, and what
an update does after the backward passes (the gradients' norm and clipping, a non-finite update
skipped on the device, the schedule's step). The trainer's update and benchmarks/bench_train.py's
Marian update are both this one."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from transformer_mt.config import TrainJob
from transformer_mt.train.schedule import paper_schedule


def optimizer_and_schedule(
    model: torch.nn.Module, cfg: TrainJob
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The paper's Adam and learning-rate schedule. Fused Adam (CPU and GPU) can skip an update
    on a device-side flag, without a host sync (`finish_update`)."""
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=1.0,
        betas=tuple(cfg.optim.betas),
        eps=cfg.optim.eps,
        weight_decay=cfg.optim.weight_decay,
        fused=True,
    )
    schedule = paper_schedule(
        optimizer,
        d_model=cfg.model.d_model,
        warmup_steps=cfg.optim.warmup_steps,
        scale=cfg.optim.lr_scale,
    )
    return optimizer, schedule


def clipped_gradient_norm(parameters: Iterable[torch.nn.Parameter], clip: float) -> torch.Tensor:
    """The gradients' norm before clipping, clipped to `clip` (optim.clip_norm) where it is set;
    with clipping off, only measured (clip_grad_norm_ with an infinite bound would still multiply
    every gradient by 1)."""
    parameters = list(parameters)
    if clip > 0:
        return torch.nn.utils.clip_grad_norm_(parameters, clip)
    return torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])


def finish_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    clip: float,
    *,
    keep_gradients: bool = False,
) -> torch.Tensor:
    """The update after the backward passes: the gradients unscaled (fp16), their norm clipped,
    the optimizer's step (skipped where the norm is not finite, told on the device: no host
    sync), the schedule's step, the gradients dropped. Returns the norm before clipping, a
    device tensor. keep_gradients: zero them in place instead (under DDP they are views of its
    buckets: set to None, the next backward would make them afresh and copy them back)."""
    scaler.unscale_(optimizer)
    grad_norm = clipped_gradient_norm(model.parameters(), clip)
    if scaler.is_enabled():
        scaler.step(optimizer)  # skips non-finite updates itself
        scaler.update()
    else:
        # The protocol GradScaler uses with fused optimizers: where found_inf is 1 the step
        # changes neither parameters nor moments nor Adam's step count.
        optimizer.found_inf = (~torch.isfinite(grad_norm)).to(torch.float32)
        optimizer.step()
        del optimizer.found_inf
    scheduler.step()
    optimizer.zero_grad(set_to_none=not keep_gradients)
    return grad_norm
