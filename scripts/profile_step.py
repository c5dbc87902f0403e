"""Where one training update's time goes: the update run once under torch.profiler, its time
summed by CUDA kernel on a GPU (by operator on the CPU) and grouped into kinds of work.
`bench_train.py --profile` prints it under the throughput table, so that an MFU below its target
comes with its explanation from the same run (`make gpu-check` asks for it).

On a GPU the busy time is the sum of the kernels' times (one stream: they do not overlap), set
against the update's wall time: a GPU busy much less than the wall time waits for the host
(kernel launches, Python), which no faster kernel fixes. On the CPU it is the operators' own time
on the calling thread.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

KINDS = (  # first match wins; CUDA kernel names (cuBLAS, flash attention, Triton) or aten ops
    ("attention", r"flash|fmha|attention|sdpa"),  # before matmul: some are cutlass kernels
    ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|^aten::(mm|addmm|bmm|matmul|linear)$"),
    ("fused by torch.compile", r"^triton_"),
    ("softmax and loss", r"softmax|nll_loss|cross_entropy"),
    ("layer norm", r"layer_norm|layernorm"),
    ("dropout", r"bernoulli|dropout"),
    ("optimizer", r"adam|multi_tensor|foreach"),
)


@dataclass(frozen=True)
class StepProfile:
    where: str  # "GPU kernels" or "CPU operators"
    wall_seconds: float
    busy_seconds: float
    kinds: dict[str, float]  # kind of work -> seconds, "other" included
    top: list[tuple[str, float, int]]  # (kernel or operator, seconds, calls), longest first

    def lines(self, what: str) -> list[str]:
        busy = self.busy_seconds or 1e-12
        kinds = "  ".join(
            f"{kind} {seconds / busy:.1%}"
            for kind, seconds in sorted(self.kinds.items(), key=lambda item: -item[1])
        )
        return [
            f"  profile, {what}; {self.where} by torch.profiler: {self.wall_seconds:.3f} s wall, "
            f"busy {self.busy_seconds:.3f} s ({self.busy_seconds / self.wall_seconds:.0%})",
            f"    of the busy time: {kinds}",
            *(
                f"    {seconds / busy:6.1%} {calls:>6,} calls  {name[:100]}"
                for name, seconds, calls in self.top
            ),
        ]


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, name, re.I)), "other")


def profile_update(update: Callable[[], object], device: torch.device, top: int = 8) -> StepProfile:
    """Run `update` once under the profiler, waiting for the device before and after."""
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    if on_gpu:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as profiler:
        started = time.perf_counter()
        update()
        if on_gpu:
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - started
    totals = []
    for event in profiler.key_averages():
        if on_gpu:  # torch < 2.4 names it self_cuda_time_total
            micros = getattr(event, "self_device_time_total", None)
            micros = event.self_cuda_time_total if micros is None else micros
        else:
            micros = event.self_cpu_time_total
        if micros > 0:
            totals.append((event.key, micros / 1e6, event.count))
    totals.sort(key=lambda total: -total[1])
    kinds: dict[str, float] = {}
    for name, seconds, _ in totals:
        kind = kind_of(name)
        kinds[kind] = kinds.get(kind, 0.0) + seconds
    return StepProfile(
        "GPU kernels" if on_gpu else "CPU operators",
        wall,
        sum(seconds for _, seconds, _ in totals),
        kinds,
        totals[:top],
    )
