"""Which device a run uses, and how its process is set up for it, once, by every command alike
(`prepare_process`: threads, the GPU made current, TF32, malloc; the CUDA allocator when the
device is resolved); how the model runs on it is execution.py's. The host's CPU cores and
memory."""

from __future__ import annotations

import ctypes
import logging
import os
import re
from collections.abc import MutableMapping

import torch

from transformer_mt.errors import ConfigError
from transformer_mt.torch_builds import (
    CUDA_BUILDS,
    TORCH_WHEELS,
    NvidiaSmiFailed,
    build_for_driver,
    driver_cuda,
    nvidia_smi,
    older_driver,
)

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """'auto' means CUDA when torch can use it, else Apple's GPU (MPS), else the CPU, logged; a
    machine whose NVIDIA GPUs torch cannot use (nvidia-smi lists them, torch sees none) is an
    error rather than a silent CPU run. On CUDA, before anything starts it, the allocator is
    given expandable segments (`use_expandable_segments`)."""
    if name == "auto":
        if torch.cuda.is_available():  # asks the driver; starts neither CUDA nor its allocator
            use_expandable_segments(os.environ)
            device, why = torch.device("cuda"), torch.cuda.get_device_name()
        elif torch.backends.mps.is_available():
            device, why = torch.device("mps"), "Apple GPU through Metal (MPS)"
        else:
            check_no_unusable_gpus(nvidia_smi_with_gpus())
            device, why = torch.device("cpu"), "no CUDA or MPS device visible to torch"
        log.info("device=auto: %s (%s)", device, why)
        return device
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            check_no_unusable_gpus(nvidia_smi_with_gpus())
            raise ConfigError(f"device '{name}': torch {torch.__version__} has no CUDA here")
        use_expandable_segments(os.environ)
    return device


def nvidia_smi_with_gpus() -> str | None:
    """What `nvidia-smi` prints (its table, then its GPU list), or None where it is not
    installed or finds no GPU; ConfigError with what it said where it fails (a broken driver
    must not turn a GPU run into a CPU run unseen)."""
    try:
        table, gpus = nvidia_smi(), nvidia_smi("-L")
    except NvidiaSmiFailed as failed:
        raise ConfigError(
            f"{failed.problem}: the NVIDIA driver does not work as installed (after a driver "
            "upgrade, reboot), so torch sees no GPU; or train on the CPU on purpose with "
            "trainer.device=cpu (eval and translate: device=cpu)"
        ) from None
    return None if table is None or gpus is None else f"{table}\n{gpus}"


def check_no_unusable_gpus(smi_output: str | None) -> None:
    """ConfigError when nvidia-smi lists GPUs that torch cannot use: the usual cause is a driver
    older than the CUDA the torch wheel was built for, or a CPU-only wheel. The fix it names is
    the torch build for the driver's CUDA (torch_builds, as make install chooses it)."""
    gpus = re.findall(r"^GPU \d+: (.+?)(?: \(UUID|$)", smi_output or "", re.MULTILINE)
    if not gpus:
        return
    cuda = driver_cuda(smi_output)
    driver = f"{cuda[0]}.{cuda[1]}" if cuda else "of an unknown version"
    wheel_cuda = torch.version.cuda
    wheel = tuple(int(part) for part in wheel_cuda.split(".")[:2]) if wheel_cuda else None
    too_old = " (a driver older than the wheel's CUDA cannot run it)"
    cause = (
        f"this torch {torch.__version__} is a CPU-only build"
        if wheel is None
        else f"this torch {torch.__version__} is built for CUDA {wheel_cuda}, and the driver "
        f"supports CUDA {driver}{too_old if cuda and cuda < wheel else ''}"
    )
    build = build_for_driver(cuda) if cuda else None
    if cuda is None:
        fix = "Install the torch build whose CUDA the driver supports: " + ", ".join(
            f"{TORCH_WHEELS}/{name} for CUDA {built[0]}.{built[1]} or newer"
            for name, built, _ in CUDA_BUILDS
        )
    elif build is None:
        fix = older_driver(cuda)
    elif wheel is not None and build == f"cu{wheel[0]}{wheel[1]}":
        fix = (
            "This torch's CUDA build suits the driver: check that CUDA_VISIBLE_DEVICES does not "
            "hide the GPUs and that this process may open /dev/nvidia*"
        )
    else:
        version = torch.__version__.split("+")[0]
        fix = (
            f"Install the build for this driver: pip install torch=={version}+{build} "
            f"--index-url {TORCH_WHEELS}/{build} (or make clean install TORCH_CUDA={build})"
        )
    raise ConfigError(
        f"nvidia-smi lists {len(gpus)} GPU(s) ({', '.join(sorted(set(gpus)))}) but torch sees "
        f"none: {cause}. {fix}; or train on the CPU on purpose with trainer.device=cpu (eval and "
        "translate: device=cpu)"
    )


# The caching allocator's settings: PYTORCH_ALLOC_CONF, or the older name torch still reads
# (and warns about, since torch 2.9) when the new one is unset.
ALLOCATOR_SETTINGS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
EXPANDABLE_SEGMENTS = "expandable_segments:True"


def use_expandable_segments(environ: MutableMapping[str, str]) -> bool:
    """Set PYTORCH_ALLOC_CONF=expandable_segments:True in `environ` unless the user configured
    the allocator (either name, kept as it is); True when set. Batches of varying shapes leave
    the caching allocator's fixed-size segments fragmented, so a GPU near full memory spends its
    time freeing and re-allocating them (30% of a step in NVIDIA/NeMo#9061); expandable segments
    grow in place instead. Torch reads the setting once, when CUDA's allocator starts: call this
    before anything uses CUDA."""
    if any(environ.get(name) is not None for name in ALLOCATOR_SETTINGS):
        return False
    environ[ALLOCATOR_SETTINGS[0]] = EXPANDABLE_SEGMENTS
    return True


def use_cuda_device(device: torch.device) -> None:
    """For a run on `device`, where it is a GPU: make it this process's current GPU (where an
    index is given; otherwise the DataLoader's pin-memory thread and pinned batches create a
    CUDA context, about 0.5 GB, on GPU 0 too), and let fp32 matrix products use TF32 (logged
    when it changes the setting: once per process)."""
    if device.type != "cuda":
        return
    if device.index is not None:
        torch.cuda.set_device(device)
    if torch.get_float32_matmul_precision() == "highest":  # torch's default: IEEE fp32
        # fp32 GEMMs (all of them with trainer.precision=fp32; those outside autocast with bf16
        # or fp16) run at about 1/7 of TF32's rate otherwise (H100: 67 against 495 dense
        # TFLOP/s). The legacy switch, not `fp32_precision = "tf32"`: it sets the old and the
        # new setting alike, and torch.compile reads the old one, which raises after the new
        # one alone was set ("mix of the legacy and new APIs").
        torch.backends.cuda.matmul.allow_tf32 = True
        log.info("CUDA: fp32 matrix products in TF32 (10-bit mantissa inputs, fp32 sums)")


def prepare_process(
    device: torch.device, threads: int = 0, *, keep_freed_memory: bool = True
) -> None:
    """Set this process up for running the model on `device` (resolved: `resolve_device`, which
    already gave CUDA's allocator its expandable segments before anything started CUDA), the one
    way for training (train/distributed.start_ranks) and decoding (decode/loading.py) alike:
    `threads` intra-op threads for torch (0: torch's default); on the CPU freed memory kept in
    the heap (keep_freed_host_memory; keep_freed_memory=False leaves malloc as it is, for a
    process that embeds the library); on CUDA the GPU made current and TF32 for float32 products
    (use_cuda_device)."""
    if threads:
        torch.set_num_threads(threads)
    if device.type == "cpu" and keep_freed_memory:
        keep_freed_host_memory()
    use_cuda_device(device)


def set_up_process(name: str, threads: int = 0) -> torch.device:
    """The device `name` (resolve_device), with this process set up for it as the commands set
    theirs up (`prepare_process`). The benchmarks call it, so that they time the allocator and
    the kernels a training run uses."""
    device = resolve_device(name)
    prepare_process(device, threads)
    return device


def describe_set_up(device: torch.device) -> str:
    """One line on what `set_up_process` gave this process's device (for a report's header)."""
    if device.type != "cuda":
        return f"{device}: freed host memory kept in the heap"
    settings = [f"{name}={os.environ[name]}" for name in ALLOCATOR_SETTINGS if name in os.environ]
    allocator = ", ".join(settings) or "torch's default (no allocator setting)"
    tf32 = "on" if torch.backends.cuda.matmul.allow_tf32 else "off"
    return f"{device}: CUDA allocator {allocator}; TF32 for float32 products {tf32}"


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
