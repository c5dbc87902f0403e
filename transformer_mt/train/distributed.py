"""Ranks under torchrun: process groups, each rank's device, and small host-side agreements.

`torchrun` (or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT)
starts one process per device; a plain `tmt-train` is one rank of a world of one. Gradients are
averaged by DistributedDataParallel over the main group (NCCL on GPUs, gloo on CPUs). Decisions the
ranks must share (token counts, a signal, a time-based checkpoint) go over a second, gloo group on
CPU tensors, so agreeing on them never waits for the GPU.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from transformer_mt.device import resolve_device
from transformer_mt.errors import ConfigError


@dataclass
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    control: dist.ProcessGroup | None = None  # gloo group for host-side agreements

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of `values` over all ranks (a CPU all-reduce; no GPU sync)."""
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, group=self.control)
        return tensor.tolist()

    def broadcast(self, values: list[float]) -> list[float]:
        """Rank 0's `values` on every rank."""
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.broadcast(tensor, src=0, group=self.control)
        return tensor.tolist()

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's CPU `tensor` (same shape on all ranks), in rank order."""
        if not self.distributed:
            return [tensor]
        gathered = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(gathered, tensor, group=self.control)
        return gathered

    def gather_text(self, text: str) -> list[str]:
        """Every rank's `text`, in rank order (UTF-8 bytes over the control group; no pickle)."""
        if not self.distributed:
            return [text]
        encoded = torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)
        lengths = [int(n) for n in self.gather(torch.tensor([len(encoded)]))]
        padded = torch.zeros(max(lengths), dtype=torch.uint8)
        padded[: len(encoded)] = encoded
        gathered = self.gather(padded)
        return [
            bytes(t[:n].tolist()).decode("utf-8") for t, n in zip(gathered, lengths, strict=True)
        ]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.control)


def start_ranks(device_name: str, timeout_minutes: float = 30.0) -> tuple[Ranks, torch.device]:
    """This process's rank and device; joins the process group when launched by torchrun.
    A collective that waits longer than `timeout_minutes` for another rank fails the job."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Ranks(), resolve_device(device_name)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = resolve_device(device_name)
    if device.type == "cuda":
        if device_name not in ("auto", "cuda"):
            raise ConfigError(
                f"trainer.device: under torchrun each rank uses cuda:LOCAL_RANK; "
                f"use auto or cuda, got {device_name}"
            )
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"rank {rank} has no GPU: torchrun started at least {local_rank + 1} processes on "
                f"this machine, which has {torch.cuda.device_count()} GPU(s) (make train "
                f"NPROC={torch.cuda.device_count()}, or torchrun --nproc-per-node)"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(minutes=timeout_minutes)
    dist.init_process_group(backend, timeout=timeout)
    control = (
        dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
    )
    return Ranks(rank, world_size, local_rank, control), device


def stop_ranks(ranks: Ranks) -> None:
    if ranks.distributed and dist.is_initialized():
        dist.destroy_process_group()
