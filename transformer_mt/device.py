"""Which device and precision a run uses."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch


def resolve_device(name: str) -> torch.device:
    """'auto' means CUDA when available, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_for(device: torch.device, precision: str) -> AbstractContextManager:
    """bf16 autocast on GPU by default; fp32 on CPU unless bf16 is asked for."""
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()
