"""Which PyTorch build fits this machine's NVIDIA driver: `make install` asks (through
scripts/torch_index.py) which wheel index to take torch from, and device.py names the index when
torch cannot use the GPUs nvidia-smi lists. The standard library only: make install runs it
before torch is installed."""

from __future__ import annotations

import re
import shutil
import subprocess

from transformer_mt.errors import ConfigError

TORCH_WHEELS = "https://download.pytorch.org/whl"
"""PyTorch's wheel indexes: TORCH_WHEELS/cpu, TORCH_WHEELS/cu130, ..."""
TORCH_SERIES = "2.13"
"""The torch the table below describes: the Makefile's TORCH_VERSION."""
CUDA_BUILDS = (("cu130", (13, 0), "R580"), ("cu126", (12, 6), "R560"))
"""torch 2.13's CUDA builds, newest first: the index's name, the CUDA it is built with (which the
driver must support: nvidia-smi's "CUDA Version"), and the oldest driver branch that does.
cu130 is PyPI's Linux wheel; 2.12 dropped cu128 and cu132 is experimental (PyTorch's
RELEASE.md), so neither is offered."""
CPU_BUILD = "cpu"


class NvidiaSmiFailed(ConfigError):
    """nvidia-smi is installed but fails: a driver is there, and not working (its library and
    kernel module of other versions after an upgrade without a reboot, a GPU that fell off the
    bus), so neither a CUDA build nor the CPU can be chosen from it. The message is make
    install's; `problem` says what nvidia-smi said, for device.py's own."""

    def __init__(self, problem: str):
        self.problem = problem
        super().__init__(
            f"{problem}. The NVIDIA driver does not work as installed (after a driver upgrade, "
            f"reboot); or choose the torch build with TORCH_CUDA={'|'.join(build_names())}"
        )


NO_GPU = "No devices were found"  # what nvidia-smi says (exit status 6) on a machine without GPUs


def nvidia_smi(*arguments: str) -> str | None:
    """What `nvidia-smi ARGUMENTS` prints (no arguments: its table); None where it is not
    installed or finds no GPU. NvidiaSmiFailed, with what it said, where it fails otherwise."""
    if shutil.which("nvidia-smi") is None:
        return None
    command = " ".join(["nvidia-smi", *arguments])
    try:
        done = subprocess.run(
            ["nvidia-smi", *arguments], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        raise NvidiaSmiFailed(f"{command} did not answer within 30 s") from None
    except OSError as error:
        raise NvidiaSmiFailed(f"{command} could not run ({error.strerror})") from None
    said = " ".join((done.stderr.strip() or done.stdout.strip()).split())
    if done.returncode == 0:
        return done.stdout
    if NO_GPU in said:
        return None
    raise NvidiaSmiFailed(
        f"{command} failed (exit status {done.returncode}): {said or 'it printed nothing'}"
    )


def driver_cuda(smi_output: str | None) -> tuple[int, int] | None:
    """The newest CUDA the driver supports, from nvidia-smi's "CUDA Version: 12.4", or None."""
    found = re.search(r"CUDA Version: (\d+)\.(\d+)", smi_output or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def build_for_driver(cuda: tuple[int, int]) -> str | None:
    """The newest CUDA build of torch that a driver supporting `cuda` runs; None where it is
    older than every build."""
    return next((name for name, built, _ in CUDA_BUILDS if cuda >= built), None)


def older_driver(cuda: tuple[int, int]) -> str:
    """Why a driver supporting `cuda` runs no CUDA build of torch, and what to update it to."""
    oldest, built, branch = CUDA_BUILDS[-1]
    newest, _, newest_branch = CUDA_BUILDS[0]
    return (
        f"torch {TORCH_SERIES} has no build for a driver of CUDA {cuda[0]}.{cuda[1]} (its "
        f"oldest, {oldest}, needs CUDA {built[0]}.{built[1]}): update the driver to {branch} or "
        f"newer ({newest_branch} for {newest}, PyPI's build)"
    )


def build_names() -> list[str]:
    """Every build make install can take: cpu, cu126, cu130."""
    return [CPU_BUILD, *sorted(name for name, _, _ in CUDA_BUILDS)]


def requested_build(name: str) -> str:
    """The build TORCH_CUDA names, checked against the builds torch has."""
    if name not in build_names():
        raise ConfigError(
            f"TORCH_CUDA={name}: torch {TORCH_SERIES} has no such build; one of "
            f"{', '.join(build_names())} ({TORCH_WHEELS}/)"
        )
    return name


def detected_build(smi_output: str | None) -> str:
    """The build for the driver nvidia-smi describes: the CPU build without nvidia-smi (or
    without GPUs), else the newest CUDA build the driver runs; an error naming the driver to
    install where it runs none."""
    if smi_output is None:
        return CPU_BUILD
    cuda = driver_cuda(smi_output)
    if cuda is None:
        raise ConfigError(
            "nvidia-smi prints no 'CUDA Version': choose the torch build with "
            f"TORCH_CUDA={'|'.join(build_names())}"
        )
    build = build_for_driver(cuda)
    if build is None:
        oldest, built, _ = CUDA_BUILDS[-1]
        attempt = (
            f"; or TORCH_CUDA={oldest} to try it on this driver (CUDA's minor version "
            f"compatibility runs a CUDA {built[0]} build on any CUDA {built[0]} driver, but "
            "torch.compile's kernels may fail to load: trainer.compile=false)"
            if cuda[0] == built[0]
            else ""
        )
        raise ConfigError(f"{older_driver(cuda)}{attempt}; or TORCH_CUDA={CPU_BUILD}")
    return build


def index_arguments(build: str) -> list[str]:
    """pip's arguments that install `build`: the CPU index beside PyPI (as before, so that a
    local wheel folder or mirror still serves it), or the CUDA build's index alone (PyPI's
    torch is the cu130 one)."""
    if build == CPU_BUILD:
        return ["--extra-index-url", f"{TORCH_WHEELS}/{CPU_BUILD}"]
    return ["--index-url", f"{TORCH_WHEELS}/{build}"]
