"""Which device and precision a run uses; the host's CPU cores and memory."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import subprocess
from contextlib import AbstractContextManager, nullcontext

import torch

from transformer_mt.config import Precision
from transformer_mt.errors import ConfigError

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """'auto' means CUDA when torch can use it, else Apple's GPU (MPS), else the CPU, logged; a
    machine whose NVIDIA GPUs torch cannot use (nvidia-smi lists them, torch sees none) is an
    error rather than a silent CPU run."""
    if name == "auto":
        if torch.cuda.is_available():
            device, why = torch.device("cuda"), torch.cuda.get_device_name()
        elif torch.backends.mps.is_available():
            device, why = torch.device("mps"), "Apple GPU through Metal (MPS)"
        else:
            check_no_unusable_gpus(nvidia_smi())
            device, why = torch.device("cpu"), "no CUDA or MPS device visible to torch"
        log.info("device=auto: %s (%s)", device, why)
        return device
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        check_no_unusable_gpus(nvidia_smi())
        raise ConfigError(f"device '{name}': torch {torch.__version__} has no CUDA here")
    return device


def nvidia_smi() -> str | None:
    """What `nvidia-smi` prints (its table, then its GPU list), or None where it is not
    installed or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        runs = [
            subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout
            for command in (["nvidia-smi"], ["nvidia-smi", "-L"])
        ]
    except (OSError, subprocess.SubprocessError):
        return None
    return "\n".join(runs)


def check_no_unusable_gpus(smi_output: str | None) -> None:
    """ConfigError when nvidia-smi lists GPUs that torch cannot use: the usual cause is a driver
    older than the CUDA the torch wheel was built for, or a CPU-only wheel."""
    gpus = re.findall(r"^GPU \d+: (.+?)(?: \(UUID|$)", smi_output or "", re.MULTILINE)
    if not gpus:
        return
    driver_cuda = re.search(r"CUDA Version: ([\d.]+)", smi_output or "")
    wheel_cuda = torch.version.cuda
    cause = (
        f"this torch {torch.__version__} is a CPU-only build"
        if wheel_cuda is None
        else f"this torch {torch.__version__} is built for CUDA {wheel_cuda}, and the driver "
        f"supports CUDA {driver_cuda.group(1) if driver_cuda else 'of an unknown version'}"
        " (a driver older than the wheel's CUDA cannot run it)"
    )
    raise ConfigError(
        f"nvidia-smi lists {len(gpus)} GPU(s) ({', '.join(sorted(set(gpus)))}) but torch sees "
        f"none: {cause}. Install a torch build for this driver (https://pytorch.org/get-started/"
        "locally/, e.g. pip install torch --index-url https://download.pytorch.org/whl/cu121 for "
        "a CUDA 12.1 driver) or update the driver; or train on the CPU on purpose with "
        "trainer.device=cpu (eval and translate: device=cpu)"
    )


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
