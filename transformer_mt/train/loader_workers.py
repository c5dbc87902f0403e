"""How the training DataLoader's worker processes (trainer.loader_workers) start and end.

On Linux they start from a fork server, not as forks of the training process. A fork shares the
trainer's heap copy-on-write, so after each epoch's new worker every page the trainer wrote
again was copied: bursts of up to 383,000 page faults in 15 s at each epoch's start, with up to
80% of a core in the kernel, in a Multi30k run on 2 cores (benchmarks/multi30k_recipe.txt,
run 6). The server is a separate process that imports torch and the batching code once
(train/loader_server.py) and ignores the stop signals, as its workers do: a SIGTERM to the whole
process group leaves them to the trainer, which finishes its update and saves. The trainer
starts the server with the stop signals held back (signals.held_for_children), so that one sent
while the server imports is not fatal to it either; a server that ends all the same (SIGKILL,
the out-of-memory killer) while a worker starts is one line (`worker_batches`).

A worker forked from the server is not the trainer's child, so torch's own check (is my parent
alive?) watches the server instead, and the server lives as long as any worker holds its pipe.
`start_worker` therefore watches the trainer itself: a worker ends when the trainer is killed.
The other way round, a worker that is killed (most often by the kernel's out-of-memory killer)
is noticed by torch's poll of its workers, every 5 s, and `worker_batches` turns torch's bare
RuntimeError into a TransformerMTError that says what probably killed it and what to do.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

from transformer_mt.errors import TransformerMTError
from transformer_mt.train.signals import held_for_children, ignore_stop_signals

Item = TypeVar("Item")
WORKER_DIED = "DataLoader worker"  # how torch's errors for a worker that ended begin


def worker_context() -> multiprocessing.context.BaseContext | None:
    """The fork server on Linux, running (started now where it is not, as at the first epoch or
    after it was killed); elsewhere None, DataLoader's default (spawn on macOS and Windows, where
    a fork of a process that has imported torch is not safe)."""
    if sys.platform != "linux":
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["transformer_mt.train.loader_server"])
    start_fork_server()
    return context


def start_fork_server() -> None:
    """The fork server, and multiprocessing's resource tracker that it needs, started where
    they are not running, each with the stop signals held back (signals.held_for_children). The
    tracker first, alone: starting it unblocks SIGINT and SIGTERM in this thread as it returns
    (it ignores those two itself), which would expose the server if both started in one go."""
    with held_for_children():
        multiprocessing.resource_tracker.ensure_running()
    with held_for_children():
        multiprocessing.forkserver.ensure_running()


def start_worker(worker_id: int) -> None:
    """The workers' worker_init_fn: leave stop signals to the trainer, and end when it ends."""
    ignore_stop_signals()
    trainer = multiprocessing.parent_process()
    if trainer is not None:
        threading.Thread(target=end_with, args=(trainer.sentinel,), daemon=True).start()


def end_with(sentinel: int) -> None:
    """Wait for the trainer's sentinel (ready when the trainer has gone), then end this worker
    at once: nothing it holds needs saving."""
    multiprocessing.connection.wait([sentinel])
    os._exit(0)


def worker_batches(loader: Iterable[Item]) -> Iterator[Item]:
    """The loader's batches; TransformerMTError, saying what probably happened and what to do,
    where a worker ended unexpectedly (torch: "DataLoader worker (pid(s) N) exited
    unexpectedly", or "... is killed by signal: Killed." for a worker that is its child; or the
    connection that hands a batch's shared memory over reset, where the worker died while it
    sent one); also where the fork server ended while it started a worker (its pipe closes:
    EOFError)."""
    try:
        batches = iter(loader)  # starts the workers
    except EOFError as error:
        raise TransformerMTError(server_death()) from error
    try:
        yield from batches
    except (RuntimeError, ConnectionError, EOFError) as error:
        if not worker_ended(batches, error):
            raise
        raise TransformerMTError(worker_death(batches, error)) from error


def worker_ended(batches: Iterator, error: Exception) -> bool:
    """Whether `error`, raised by the loader's iterator, means that a worker ended: torch's
    message says so, or a connection broke and a worker has ended (given a few seconds to be
    reaped: the kernel closes a killed process's connections before its exit status is out)."""
    if isinstance(error, RuntimeError):
        return str(error).startswith(WORKER_DIED)
    workers = getattr(batches, "_workers", [])
    for worker in workers:
        worker.join(timeout=5.0)
    return any(worker.exitcode for worker in workers)


def server_death() -> str:
    """The one-line message for a fork server that ended while it started a worker."""
    return (
        "the data loader's fork server ended while it started a worker (it ignores stop "
        "signals, so SIGKILL or, most often, the kernel's out-of-memory killer: dmesg says "
        "'Out of memory: Killed process'); free memory, or lower trainer.loader_workers, then "
        "run the same command again: it resumes from the last checkpoint"
    )


def worker_death(batches: Iterator, error: RuntimeError) -> str:
    """The one-line message for a loader worker that ended: how (a signal's name, where torch's
    iterator knows the worker's exit status) and the likely cause and fix."""
    codes = [worker.exitcode for worker in getattr(batches, "_workers", [])]  # torch's own
    signals = sorted({signal.Signals(-code).name for code in codes if code and code < 0})
    how = f"killed by {', '.join(signals)}" if signals else str(error).strip().splitlines()[0]
    return (
        f"a data loader worker ended ({how}): most often the kernel's out-of-memory killer "
        "(dmesg says 'Out of memory: Killed process'); free memory, or lower "
        "trainer.loader_workers or trainer.batch_tokens, then run the same command again: it "
        "resumes from the last checkpoint"
    )
