"""What every benchmark measures with, written once:

- timers: `seconds_of` times calls; `median_seconds` (what a call usually costs),
  `fastest_seconds` (what it costs when the machine leaves it alone), `kernel_milliseconds`;
- peak memory: `peak_rss_mib`, VmHWM, the high-water mark of a process's own resident memory
  (`status_kib` reads /proc): the one way a peak RSS is measured, in a process or, sampled, of a
  command (`run_command`);
- child processes: `spawned` / `in_fresh_process` run a function of ours in a fresh interpreter
  (spawn: nothing inherited, so its memory is its own); `run_command` runs a command in a process
  group of its own within a time limit; `start_group` / `signal_group` for a caller that stops one
  at moments of its own choosing (the fault drill);
- `abba_order`: the order of the systems compared at each turn;
- `report_header`: the lines that head a report (the command, the date, the machine, torch).

The benchmarks run our model as the library does, through its execution policy
(transformer_mt/execution.py): they enter no autocast, SDPA-kernel or oneDNN context of their own.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import multiprocessing as mp
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TypeVar

import torch

from transformer_mt.device import describe_set_up
from transformer_mt.execution import cpu_multiplies_bf16

T = TypeVar("T")


# ---- timers ------------------------------------------------------------------------------------
def synchronize(device: torch.device | None) -> None:
    """Wait for the GPU's queued kernels (nothing to wait for on the CPU)."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_of(
    call: Callable[[], object], rounds: int, *, warmups: int = 1, device: torch.device | None = None
) -> list[float]:
    """The seconds of `rounds` calls of `call`, after `warmups` untimed ones; on a GPU (`device`)
    each from the device's last kernel before the call to the call's own last kernel."""
    for _ in range(warmups):
        call()
    times = []
    for _ in range(rounds):
        synchronize(device)
        started = time.perf_counter()
        call()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return times


def median_seconds(call: Callable[[], object], rounds: int, **options) -> float:
    return statistics.median(seconds_of(call, rounds, **options))


def fastest_seconds(call: Callable[[], object], rounds: int, **options) -> float:
    """The shortest of the rounds: a round the machine slowed says nothing of the call."""
    return min(seconds_of(call, rounds, **options))


def kernel_milliseconds(reps: int, function: Callable, *args, **kwargs) -> float:
    """The median milliseconds of function(*args, **kwargs) over `reps` calls after two warm-up
    calls (the first calls allocate and choose kernels)."""
    return 1e3 * median_seconds(functools.partial(function, *args, **kwargs), reps, warmups=2)


# ---- peak memory -------------------------------------------------------------------------------
def status_kib(pid: int | str, keys: tuple[str, ...]) -> dict[str, int]:
    """Fields of Linux's /proc/PID/status, in KiB, of those the process has (a process that has
    exited has none): VmHWM (the peak resident set), VmRSS (resident now), RssAnon (private),
    RssFile (file pages, such as the page cache's)."""
    with open(f"/proc/{pid}/status") as status:
        return {
            line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith(keys)
        }


def peak_rss_mib(pid: int | str = "self") -> float:
    """A process's peak resident set size in MiB: VmHWM, the high-water mark of its own memory.
    Not getrusage's ru_maxrss: in a process started by exec (a spawned worker, a command) that is
    at least its parent's peak when it started, which a benchmark's parent can exceed."""
    return status_kib(pid, ("VmHWM",))["VmHWM"] / 1024


# ---- child processes ---------------------------------------------------------------------------
def spawned(target: Callable, *args) -> tuple[BaseProcess, Connection]:
    """target(*args, connection) started in a fresh interpreter, and this end of the pipe to it.
    Daemonic: it ends with this process, and may start no processes of its own. Once it has
    died, recv() on this end raises EOFError instead of waiting."""
    context = mp.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=target, args=(*args, theirs), daemon=True)
    process.start()
    theirs.close()
    return process, ours


def in_fresh_process(function: Callable[..., T], *args) -> T:
    """function(*args)'s value, computed in a fresh interpreter (`spawned`)."""
    process, connection = spawned(send_value, function, *args)
    try:
        return connection.recv()
    except EOFError:
        name = function.__name__
        raise RuntimeError(f"{name} died in its own process (its traceback is above)") from None
    finally:
        process.join()


def send_value(function: Callable, *args) -> None:
    """In the child of `in_fresh_process`: send function(*args) back (the pipe's end comes last)."""
    *args, connection = args
    connection.send(function(*args))


def start_group(command: list[str], **popen) -> subprocess.Popen:
    """`command` started in a process group of its own, so that a signal to the group reaches
    every process it starts (DataLoader workers, compile workers) and none of ours."""
    return subprocess.Popen(command, start_new_session=True, **popen)


def signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
        os.killpg(process.pid, sig)


def stop_group(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the command's process group (the trainer saves a checkpoint and stops), then
    SIGKILL to what is left after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        signal_group(process, sig)
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


PEAK_SAMPLE = 0.1
"""Seconds between two readings of a command's peak RSS."""


@dataclass
class Finished:
    """What a command did."""

    status: int | None  # its exit status; None: stopped at its limit
    seconds: float
    peak_rss_mib: float = 0.0  # its own (not its children's), read every PEAK_SAMPLE seconds
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


def run_command(
    command: list[str],
    *,
    limit: float | None = None,
    env: dict | None = None,
    on_stdout: Callable[[str], None] | None = None,
    on_stderr: Callable[[str], None] | None = None,
) -> Finished:
    """`command` in a process group of its own, stopped (`stop_group`) after `limit` seconds;
    the lines of its output collected, and each handed to on_stdout / on_stderr as it comes. Its
    peak RSS is read while it runs: VmHWM only rises, so a reading misses only what the command's
    last PEAK_SAMPLE seconds added."""
    started = time.perf_counter()
    process = start_group(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    finished, ended = Finished(None, 0.0), threading.Event()
    threads = [
        threading.Thread(target=read_lines, args=(process.stdout, finished.stdout, on_stdout)),
        threading.Thread(target=read_lines, args=(process.stderr, finished.stderr, on_stderr)),
        threading.Thread(target=read_peak, args=(process.pid, ended, finished)),
    ]
    for thread in threads:
        thread.start()
    try:
        finished.status = process.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        stop_group(process)
    ended.set()
    for thread in threads:
        thread.join()
    finished.seconds = time.perf_counter() - started
    return finished


def read_peak(pid: int, ended: threading.Event, finished: Finished) -> None:
    """Keep finished.peak_rss_mib at the process's VmHWM until `ended` (once it has exited, its
    /proc entry holds no VmHWM, then none at all)."""
    while True:
        with contextlib.suppress(OSError, KeyError):
            finished.peak_rss_mib = max(finished.peak_rss_mib, peak_rss_mib(pid))
        if ended.wait(PEAK_SAMPLE):
            return


def read_lines(stream, lines: list[str], each: Callable[[str], None] | None) -> None:
    for raw in stream:
        lines.append(raw.rstrip("\n"))
        if each is not None:
            each(lines[-1])


# ---- order and report --------------------------------------------------------------------------
def abba_order(items: Sequence[T], turn: int) -> list[T]:
    """`items` in their order at even turns, reversed at odd ones (A B, B A, A B, ...): each runs
    first as often as last, so that the machine's drift over a run falls on all alike."""
    return list(items) if turn % 2 == 0 else list(reversed(items))


def report_header(title: str, device: torch.device | None = None) -> list[str]:
    """The lines that head a report: what it is, the command that printed it, the date, the
    machine (its load when the command started: the machines are shared) and torch; given the
    `device` the benchmark set its process up for (device.set_up_process), that set-up (on CUDA
    the allocator's settings and TF32)."""
    python, *arguments = sys.orig_argv
    lines = [
        f"# {title}",
        f"# command: {shlex.join([Path(python).name, *arguments])}",
        f"# date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible; "
        f"torch {torch.__version__}; load average at start {os.getloadavg()[0]:.2f}",
        f"# {cpu_bf16_line()}",
    ]
    if device is not None:
        lines.append(f"# process set up as tmt-train's: {describe_set_up(device)}")
    return lines


def cpu_bf16_line() -> str:
    """What this CPU offers for bf16 products: its flags (Linux's /proc/cpuinfo), torch's checks,
    and whether bf16 products are native on it (execution.cpu_multiplies_bf16; precision=auto is
    fp32 on every CPU: execution.autocast_dtype)."""
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "bf16")  # bf16: Arm's extension
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            flags = next(
                (
                    line.split(":", 1)[1].split()
                    for line in cpuinfo
                    if line.startswith(("flags", "Features"))
                ),
                [],
            )
        shown = " ".join(flag for flag in wanted if flag in flags) or "none of " + ", ".join(wanted)
    except OSError:
        shown = "not readable here"
    onednn = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    avx512_bf16 = torch.cpu._is_avx512_bf16_supported()
    bf16 = "native" if cpu_multiplies_bf16() else "emulated"
    return (
        f"CPU flags: {shown}; torch: cpu._is_avx512_bf16_supported() {avx512_bf16}, "
        f"mkldnn._is_mkldnn_bf16_supported() {onednn}; here bf16 products are {bf16}, and "
        "precision=auto computes in fp32 (decode and trainer)"
    )
