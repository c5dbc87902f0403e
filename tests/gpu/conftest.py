"""The CUDA tests (marker `gpu`): collected everywhere, run only where torch sees a GPU
(`make gpu-check` runs them, benchmarks/gpu_check.py), skipped elsewhere. In the check's CPU
rehearsal (GPU_CHECK_REHEARSAL=1, `gpu_check.sh --rehearse-on-cpu`) the tests that take the
`device` fixture run on the CPU instead: their code path, before the one run a GPU allows."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

# cuBLAS is deterministic only with a fixed workspace configuration (torch's reproducibility
# notes), which it reads when its handle is created: set here, at collection, before any test
# touches the GPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
REHEARSAL = os.environ.get("GPU_CHECK_REHEARSAL") == "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `gpu` are skipped, with the reason, where torch sees no GPU (but those that
    take `device`, in a rehearsal)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible (torch.cuda.is_available() is False)")
    for item in items:
        rehearsed = REHEARSAL and "device" in getattr(item, "fixturenames", ())
        if "gpu" in item.keywords and not rehearsed:
            item.add_marker(skip)


@pytest.fixture
def device() -> torch.device:
    """The GPU; the CPU in the check's rehearsal (where torch sees no GPU)."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


@pytest.fixture
def deterministic():
    """Deterministic kernels, for bitwise comparisons: torch's deterministic variants where an op
    has one. The attention kernel is the runs' own setting (toy_runs.MATH_ATTENTION): a kernel
    context entered here would be replaced by the execution policy's, which forward() enters
    for every micro-batch. Yields the messages of ops that warned they have none."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield NondeterministicOps(caught)
    finally:
        torch.use_deterministic_algorithms(False)


class NondeterministicOps:
    """The recorded warnings that name an op without a deterministic implementation."""

    def __init__(self, caught: list[warnings.WarningMessage]):
        self.caught = caught

    def __str__(self) -> str:
        messages = {str(w.message).splitlines()[0] for w in self.caught}
        found = sorted(m for m in messages if "deterministic" in m)
        return "; ".join(found) or "none"
