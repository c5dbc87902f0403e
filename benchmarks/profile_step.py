"""Where training updates' time goes: PROFILED updates run under torch.profiler (after one
skipped and one warm-up update: the first profiled step carries the profiler's own set-up), their
time summed by CUDA kernel on a GPU (by operator on the CPU) and grouped into kinds of work.
`bench_train.py --profile` prints it under the throughput table, so that an MFU below its target
comes with its explanation from the same run (`make gpu-check` asks for it).

On a GPU the busy time is the sum of the device's own events (kernels, copies, memsets; one
stream: they do not overlap), each counted once: the profiler also files a kernel's time under
the aten operator that launched it (FunctionEvent.kernels), so rows of both kinds summed count it
twice, as PyTorch's own table avoids by totalling device-type events only. Operators are
reported apart, by their own CPU time: the host's side. A GPU busy much less than the wall
time waits for the host (kernel launches, Python), which no faster kernel fixes. On the CPU the
busy time is the operators' own time on the calling thread, which never exceeds the wall time.

Copies and casts (aten::copy_: autocast's casts to bf16 and their gradients' casts back, dtype
promotions, contiguous copies) are then summed by what asked for them (`copy_origin`: the
operators above the copy, or the backward it runs in), so that a profile says which copies
there are, not only how long `direct_copy_kernel` ran. On the CPU, bf16 autocast, model=base
(1 micro-batch an update; their dtypes recorded once with record_shapes), they were per
update: 126 casts to bf16 in
aten::linear (90 weights and biases, 36 activations: the fp32 outputs of LayerNorm and the
encoder's output, which each of the 6 decoder layers casts again for its keys and values), the
126 casts of their gradients back to fp32 (ToCopyBackward0), and 30 promotions of the residual
adds (fp32 + bf16) with the 30 casts of their gradients (2026-12-05, torch 2.13.0+cpu:
`python -m benchmarks.bench_train --data generated --generated-pairs 3000 --vocab 2000 --model
base --batch-tokens 2048 --columns ours --warmup 1 --steps 1 --block 1 --precision bf16
--gpu-report --profile`; 1,116 copies in 3 updates, 6.2% of the busy time).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile, schedule

from benchmarks.measure import synchronize

SKIPPED, WARMUP, PROFILED = 1, 1, 3  # updates: torch.profiler.schedule's wait, warmup, active
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
    updates: int  # how many updates the times cover
    wall_seconds: float
    busy_seconds: float
    kinds: dict[str, float]  # kind of work -> seconds, "other" included
    top: list[tuple[str, float, int]]  # (kernel or operator, seconds, calls), longest first
    host: list[tuple[str, float, int]]  # on a GPU: operators by their own CPU time; else empty
    copies: list[tuple[str, float, int]]  # copies and casts by what asked for them (copy_origin)

    def lines(self, what: str) -> list[str]:
        busy = self.busy_seconds or 1e-12
        kinds = "  ".join(
            f"{kind} {seconds / busy:.1%}"
            for kind, seconds in sorted(self.kinds.items(), key=lambda item: -item[1])
        )
        lines = [
            f"  profile, {what}: {self.updates} updates after {SKIPPED} skipped and {WARMUP} "
            f"warm-up; {self.where} by torch.profiler: {self.wall_seconds:.3f} s wall, busy "
            f"{self.busy_seconds:.3f} s ({self.busy_seconds / self.wall_seconds:.0%})",
            f"    of the busy time: {kinds}",
            *(
                f"    {seconds / busy:6.1%} {calls:>6,} calls  {name[:100]}"
                for name, seconds, calls in self.top
            ),
        ]
        if self.host:
            cpu = sum(seconds for _, seconds, _ in self.host)
            lines.append(
                f"    host: the longest operators by their own CPU time (shown: {cpu:.3f} s, "
                f"{cpu / self.wall_seconds:.0%} of the wall time)"
            )
            lines += [
                f"    {seconds:8.4f} s {calls:>6,} calls  {name[:100]}"
                for name, seconds, calls in self.host
            ]
        if self.copies:
            seconds = sum(seconds for _, seconds, _ in self.copies)
            calls = sum(calls for _, _, calls in self.copies)
            lines.append(
                f"    copies and casts: {calls:,} calls, {seconds / busy:.1%} of the busy time, "
                "by what asked for them (a backward's own name: its gradient's cast)"
            )
            lines += [
                f"    {seconds / busy:6.1%} {calls:>6,} calls  {name[:100]}"
                for name, seconds, calls in self.copies
            ]
        return lines


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, name, re.I)), "other")


def totals(timed: Iterable[tuple[str, float]]) -> list[tuple[str, float, int]]:
    """(name, seconds, calls) per name of (name, microseconds) pairs, longest first; zeros out."""
    by_name: dict[str, list[float]] = {}
    for name, micros in timed:
        by_name.setdefault(name, []).append(micros)
    rows = [(name, sum(times) / 1e6, len(times)) for name, times in by_name.items()]
    return sorted((row for row in rows if row[1] > 0), key=lambda row: -row[1])


def device_events(events: Iterable[FunctionEvent]) -> list[tuple[str, float, int]]:
    """The device's own events (kernels, copies, memsets), each once: not the aten operators
    that launched them (which carry their kernels' time as well), nor user annotations (a
    profiler step's span on the GPU's timeline)."""
    return totals(
        (event.name, event.self_device_time_total)
        for event in events
        if event.device_type == DeviceType.CUDA and not event.is_user_annotation
    )


def host_operators(events: Iterable[FunctionEvent]) -> list[tuple[str, float, int]]:
    """Operators by their own CPU time (children's excluded, so nested ones are not counted
    twice), without user annotations (a profiler step's own time is the Python between ops)."""
    return totals(
        (event.name, event.self_cpu_time_total)
        for event in events
        if event.device_type == DeviceType.CPU and not event.is_user_annotation
    )


# Operators that only carry a copy on to the one that does it: an origin is the first other one.
COPY_CARRIERS = frozenset(
    ("aten::copy_", "aten::_to_copy", "aten::to", "aten::contiguous", "aten::clone",
     "aten::reshape", "aten::_reshape_alias", "aten::type_as", "aten::expand_as")
)  # fmt: skip
BACKWARD = "autograd::engine::evaluate_function: "


def copy_origin(event: FunctionEvent) -> str:
    """What asked for the copy `event` (an aten::copy_): in a backward, the autograd function
    it runs in ("backward of ToCopyBackward0": the gradient of a cast, cast back); otherwise its
    two nearest ancestors that are not mere carriers of copies (COPY_CARRIERS), e.g. "aten::linear
    < ProfilerStep*" for autocast's cast of a linear layer's weight or input."""
    names = []
    parent = event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    backward = next((name for name in names if name.startswith(BACKWARD)), None)
    if backward is not None:
        return f"backward of {backward.removeprefix(BACKWARD)}"
    outer = [name for name in names if name not in COPY_CARRIERS and not name.startswith("##")]
    if not outer:
        return "a copy asked for by Python (no operator above it)"
    return " < ".join(outer[:2])


def copies_by_origin(events: Iterable[FunctionEvent], on_gpu: bool) -> list[tuple[str, float, int]]:
    """Copies by copy_origin: on a GPU their kernels, named after it (bfloat16_copy_kernel_cuda:
    fp32 to bf16; direct_copy_kernel_cuda: any other, bf16 to fp32 among them), on the CPU the
    copy operators' own time. (Their dtypes would need record_shapes, whose cost on the host
    would change how busy the profile finds the GPU.)"""
    timed = []
    for event in events:
        if event.name != "aten::copy_" or event.is_user_annotation:
            continue
        origin = copy_origin(event)
        if on_gpu:
            timed += [
                (f"{origin}: {copy_kernel(kernel.name)}", kernel.duration)
                for kernel in event.kernels
            ]
        else:
            timed.append((origin, event.self_cpu_time_total))
    return totals(timed)


def copy_kernel(name: str) -> str:
    """A copy kernel's own name out of its template's ("direct_copy_kernel_cuda")."""
    found = re.search(r"\w*copy\w*_cuda|\w*[Mm]emcpy\w*", name)
    return found.group(0) if found else name[:40]


def profile_update(update: Callable[[], object], device: torch.device, top: int = 8) -> StepProfile:
    """Run `update` SKIPPED + WARMUP + PROFILED times under the profiler; the profile of the
    last PROFILED, whose wall time runs from the device's last kernel before them to its last
    kernel of theirs (before the profiler stops and collects)."""
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    steps = SKIPPED + WARMUP + PROFILED

    def wait_for_device() -> float:
        synchronize(device)
        return time.perf_counter()

    plan = schedule(wait=SKIPPED, warmup=WARMUP, active=PROFILED, repeat=1)
    with profile(activities=activities, schedule=plan) as profiler:
        for number in range(steps):
            if number == SKIPPED + WARMUP:
                started = wait_for_device()
            update()
            if number == steps - 1:
                wall = wait_for_device() - started
            profiler.step()
    events = profiler.events()
    kernels = device_events(events) if on_gpu else host_operators(events)
    kinds: dict[str, float] = {}
    for name, seconds, _ in kernels:
        kind = kind_of(name)
        kinds[kind] = kinds.get(kind, 0.0) + seconds
    return StepProfile(
        "GPU kernels" if on_gpu else "CPU operators",
        PROFILED,
        wall,
        sum(seconds for _, seconds, _ in kernels),
        kinds,
        kernels[:top],
        host_operators(events)[:top] if on_gpu else [],
        copies_by_origin(events, on_gpu)[:top],
    )
