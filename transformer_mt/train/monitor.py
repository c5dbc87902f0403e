"""What the training loop measures: per-window scalars for TensorBoard, and non-finite updates
counted on the device so that no update waits for the host."""

from __future__ import annotations

import math

import torch


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


def window_scalars(window: list[dict], seconds: float, peak_flops: float | None) -> dict:
    """Scalars for the updates since the last log: token-weighted loss, throughput, FLOP/s and
    (on a known GPU) model FLOPs utilisation, padding. Reads device values: a host sync."""
    tokens = sum(m["tokens"] for m in window)
    loss = float(sum(m["loss"] * m["tokens"] for m in window)) / tokens
    nll = float(sum(m["nll"] * m["tokens"] for m in window)) / tokens
    flops_per_s = sum(m["flops"] for m in window) / max(seconds, 1e-9)
    scalars = {
        "loss": loss,
        "nll": nll,
        "ppl": math.exp(min(nll, 50.0)),
        "lr": window[-1]["lr"],
        "grad_norm": float(window[-1]["grad_norm"]),
        "tokens_per_s": tokens / max(seconds, 1e-9),  # all ranks
        "tflops_per_s": flops_per_s / 1e12,  # this rank's
        "padding": sum(m["padding"] for m in window) / len(window),
    }
    if peak_flops:
        scalars["mfu"] = flops_per_s / peak_flops
    return scalars
