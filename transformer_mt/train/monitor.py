"""What the training loop measures: per-window scalars for TensorBoard, and non-finite updates
counted on the device so that no update waits for the host."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from transformer_mt.train.flops import Flops


class NonFiniteUpdates:
    """Counts skipped updates on the device; read (a host sync) only at logging intervals."""

    def __init__(self, device: torch.device):
        self.total = torch.zeros((), dtype=torch.int64, device=device)
        self.in_a_row = torch.zeros_like(self.total)
        self.longest_run = torch.zeros_like(self.total)

    def add(self, nonfinite: torch.Tensor) -> None:
        self.total += nonfinite
        self.in_a_row = (self.in_a_row + 1) * nonfinite
        self.longest_run = torch.maximum(self.longest_run, self.in_a_row)

    def read(self) -> tuple[int, int]:
        """(skipped since the last read, the longest run of them in a row); starts a new count."""
        total, longest = int(self.total), int(self.longest_run)
        self.total.zero_()
        self.longest_run.copy_(self.in_a_row)
        return total, longest


@dataclass(frozen=True)
class StepStats:
    """One update's measurements; tensors stay on the device until a log reads them."""

    loss: torch.Tensor  # this rank's share of the update's per-token label-smoothed loss
    nll: torch.Tensor  # the same for the negative log-likelihood
    lr: float  # the learning rate the update used
    grad_norm: torch.Tensor  # before clipping
    tokens: float  # target tokens of the update, all ranks together
    padding: float  # share of this rank's source and target positions that are padding
    flops: Flops  # this rank's model FLOPs, on real tokens and on padded shapes


@dataclass(frozen=True)
class WindowStats:
    """The updates since the last log: token-weighted loss, throughput, FLOP/s, and model FLOPs
    utilisation on a GPU whose peak is known: on the real tokens (mfu), and beside it on the
    padded shapes the kernels ran (mfu_padded)."""

    loss: float
    nll: float
    lr: float
    grad_norm: float  # of the window's last update
    tokens_per_s: float  # all ranks
    tflops_per_s: float  # this rank's, on real tokens
    padding: float
    data_wait: float = 0.0  # share of the window's time spent waiting for the next batches
    mfu: float | None = None
    mfu_padded: float | None = None

    @classmethod
    def of(
        cls,
        window: list[StepStats],
        seconds: float,
        peak_flops: float | None,
        waited: float = 0.0,
    ) -> WindowStats:
        """Reads device values: a host sync. waited: the seconds of the window spent waiting for
        the data loader."""
        tokens = sum(s.tokens for s in window)
        flops = sum((s.flops for s in window), Flops())
        flops_per_s, padded_per_s = (f / max(seconds, 1e-9) for f in (flops.real, flops.padded))
        return cls(
            loss=float(sum(s.loss * s.tokens for s in window)) / tokens,
            nll=float(sum(s.nll * s.tokens for s in window)) / tokens,
            lr=window[-1].lr,
            grad_norm=float(window[-1].grad_norm),
            tokens_per_s=tokens / max(seconds, 1e-9),
            tflops_per_s=flops_per_s / 1e12,
            padding=sum(s.padding for s in window) / len(window),
            data_wait=waited / max(seconds, 1e-9),
            mfu=flops_per_s / peak_flops if peak_flops else None,
            mfu_padded=padded_per_s / peak_flops if peak_flops else None,
        )

    @property
    def ppl(self) -> float:
        return math.exp(min(self.nll, 50.0))

    def scalars(self) -> dict[str, float]:
        """TensorBoard's train/ scalars."""
        values = {**vars(self), "ppl": self.ppl}
        return {name: value for name, value in values.items() if value is not None}

    def format(self, step: int, epoch: int, elapsed_seconds: float) -> str:
        """The log line written every trainer.log_every updates (key=value, for grep)."""
        mfu = "" if self.mfu is None else f" mfu={self.mfu:.3f} mfu_padded={self.mfu_padded:.3f}"
        return (
            f"update {step} epoch {epoch} loss={self.loss:.3f} nll={self.nll:.3f} "
            f"ppl={self.ppl:.2f} lr={self.lr:.3e} gnorm={self.grad_norm:.3f} "
            f"tok/s={self.tokens_per_s:.0f}{mfu} data={self.data_wait:.1%} "
            f"elapsed={elapsed_seconds / 60:.1f}min"
        )

    def bar_postfix(self) -> dict[str, str]:
        return {
            "loss": f"{self.loss:.3f}",
            "ppl": f"{self.ppl:.1f}",
            "lr": f"{self.lr:.2e}",
            "tok_s": f"{self.tokens_per_s:.0f}",
        }


class ThroughputWindow:
    """The updates since the last log line and the training time they took. Time spent `aside`
    (validation, checkpoints) is left out, so that tok/s and MFU measure training alone rather
    than dipping in every window that holds a validation or a checkpoint."""

    def __init__(self) -> None:
        self.updates: list[StepStats] = []
        self.start = time.perf_counter()
        self.waited = 0.0  # seconds spent waiting for the data loader's next batches

    def add(self, stats: StepStats, waited: float = 0.0) -> None:
        self.updates.append(stats)
        self.waited += waited

    def seconds(self) -> float:
        return time.perf_counter() - self.start

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        """What runs inside does not count towards the window's time."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.start += time.perf_counter() - began
