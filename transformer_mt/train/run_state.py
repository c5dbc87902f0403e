"""What a checkpoint must carry for a run to continue exactly: the progress and RNG states.

Exact: model, optimizer, learning-rate schedule, gradient scaler, every rank's RNG and the data
position, when the run resumes with the same number of ranks and micro-batch budget. With another
layout the global batch and the schedule still continue; the data position becomes the same
fraction of the epoch in the new layout's batch order (approximate, see README).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from transformer_mt.train.distributed import Ranks

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # this rank's position in the epoch's batch list
    batches_in_epoch: int = 0  # length of that list
    layout: list[int] = field(default_factory=list)  # [world_size, micro_batch_tokens]
    train_seconds: float = 0.0
    skipped_updates: int = 0  # non-finite gradients
    best_score: float | None = None  # validation BLEU, or -loss when BLEU is off
    best_step: int | None = None  # the update best_score was measured at
    validations_without_improvement: int = 0

    @classmethod
    def from_state(cls, saved: dict) -> Progress:
        known = {name: saved[name] for name in cls.__dataclass_fields__ if name in saved}
        return cls(**known)


def rng_states(ranks: Ranks, device: torch.device) -> dict[str, list[torch.Tensor]]:
    """Every rank's RNG states: the CPU's and the GPU's (CUDA or MPS) that dropout draws from
    (a collective: all ranks call it)."""
    states = {"rng_cpu": ranks.gather(torch.get_rng_state()), "rng_cuda": [], "rng_mps": []}
    if device.type == "cuda":
        states["rng_cuda"] = ranks.gather(torch.cuda.get_rng_state(device))
    elif device.type == "mps":
        states["rng_mps"] = ranks.gather(torch.mps.get_rng_state())
    return states


def restore_rng(state: dict, ranks: Ranks, device: torch.device, seed: int, step: int) -> bool:
    """This rank's saved RNG states; with another number of ranks, fresh seeds (returns False)."""
    cpu = state.get("rng_cpu", [])
    if len(cpu) != ranks.world_size:
        torch.manual_seed(seed + 1_000_003 * (step + 1) + ranks.rank)
        return False
    torch.set_rng_state(cpu[ranks.rank])
    on_device = state.get(f"rng_{device.type}", [])
    if len(on_device) == ranks.world_size:
        if device.type == "cuda":
            torch.cuda.set_rng_state(on_device[ranks.rank], device)
        elif device.type == "mps":
            torch.mps.set_rng_state(on_device[ranks.rank])
    return True
