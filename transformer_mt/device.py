"""Which device and precision a run uses."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch


def resolve_device(name: str) -> torch.device:
    """'auto' means CUDA when available, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """bf16 on GPU by default, fp16 when asked for; None (fp32) on CPU unless bf16 is asked for."""
    if precision == "fp16":
        return torch.float16
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def autocast_for(device: torch.device, precision: str) -> AbstractContextManager:
    dtype = autocast_dtype(device, precision)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()
