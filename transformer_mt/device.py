"""Which device and precision a run uses; the host's CPU cores and memory."""

from __future__ import annotations

import ctypes
import os
from contextlib import AbstractContextManager, nullcontext

import torch

from transformer_mt.config import Precision


def resolve_device(name: str) -> torch.device:
    """'auto' means CUDA when available, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_dtype(device: torch.device, precision: Precision) -> torch.dtype | None:
    """bf16 on GPU by default, fp16 when asked for; None (fp32) on CPU unless bf16 is asked for."""
    if precision == Precision.fp16:
        return torch.float16
    if precision == Precision.bf16 or (precision == Precision.auto and device.type == "cuda"):
        return torch.bfloat16
    return None


def autocast_for(device: torch.device, precision: Precision) -> AbstractContextManager:
    dtype = autocast_dtype(device, precision)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


def keep_freed_host_memory() -> bool:
    """Make glibc's malloc reuse freed memory for large CPU tensors instead of handing it back to
    the kernel. By default every block over 32 MB (a training step's logits, log-probabilities and
    their gradients: tokens x vocabulary floats each) is a fresh mmap whose pages the kernel
    faults in and zeroes again at every step: 87,000 page faults/s and half of the CPU time spent
    in the kernel in a Multi30k run on 2 cores (benchmarks/vs_fairseq.txt). Returns False where
    the C library has no such setting (macOS, musl): nothing changes there."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # this process's C library
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    # No block is mmap'ed; freed memory stays in the heap unless 1 GiB of it lies free at its top.
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 1 << 30))


def usable_cpus() -> int:
    """CPU cores this process may run on: its affinity where the OS has one (Linux), else all."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
