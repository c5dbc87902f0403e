"""How the training DataLoader's worker processes (trainer.loader_workers) start and end.

On Linux they start from a fork server, not as forks of the training process. A fork shares the
trainer's heap copy-on-write, so after each epoch's new worker every page the trainer wrote
again was copied: bursts of up to 383,000 page faults in 15 s at each epoch's start, with up to
80% of a core in the kernel, in a Multi30k run on 2 cores (benchmarks/multi30k_recipe.txt,
run 6). The server is a separate process that imports torch and the batching code once
(train/loader_server.py) and ignores the stop signals, as its workers do: a SIGTERM to the whole
process group leaves them to the trainer, which finishes its update and saves.

A worker forked from the server is not the trainer's child, so torch's own check (is my parent
alive?) watches the server instead, and the server lives as long as any worker holds its pipe.
`start_worker` therefore watches the trainer itself: a worker ends when the trainer is killed.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import sys
import threading

from transformer_mt.train.signals import ignore_stop_signals


@functools.cache
def worker_context() -> multiprocessing.context.BaseContext | None:
    """The fork server on Linux; elsewhere None, DataLoader's default (spawn on macOS and
    Windows, where a fork of a process that has imported torch is not safe)."""
    if sys.platform != "linux":
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["transformer_mt.train.loader_server"])
    return context


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
