"""Stop requests by signal: a cluster's pre-emption (SIGTERM; SIGUSR1 or SIGUSR2, which Slurm
sends ahead of a job's time limit with --signal, SIGUSR2 for submitit's jobs), a terminal that
closes (SIGHUP; left ignored where it was, as `nohup` asks) or Ctrl-C (SIGINT).

The training loop asks `received` at the end of each update (with several ranks, at their next
agreement, every trainer.agree_every updates: all stop at the same update), saves a checkpoint
and exits cleanly. A validation is the exception: it can outlast a pre-emption's grace period,
so a stop signal ends it at once (`interrupting`: the handler raises `Interrupted` in it) and the
checkpoint comes first. A second Ctrl-C interrupts at once (Python's default), for a user who
will not wait. Once the checkpoint is written, `pass_on` gives the signal to the handler that was
there before, where a launcher installed one (submitit requeues the job from it).

The processes the trainer starts (the fork server of the DataLoader's workers, and
multiprocessing's resource tracker that it starts) must not die of a stop signal sent to the
whole process group: `held_for_children` keeps the stop signals from the processes started in
it until they can ignore them (train/loader_server.py).
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP)
KEPT_IGNORED = (signal.SIGHUP,)
"""Stop signals that stay ignored where the process started with them ignored: `nohup` ignores
SIGHUP so that a closing terminal leaves the command running."""


class Interrupted(BaseException):
    """A stop signal came during work that gives way to the checkpoint (a validation). Not an
    Exception, as KeyboardInterrupt is not: no `except Exception` on the way may swallow it."""


class StopSignals:
    """While installed (a context manager), records the first stop signal instead of dying."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.previous: dict[int, object] = {}
        self.raising = False  # inside `interrupting`

    def __enter__(self) -> StopSignals:
        caught = [
            sig
            for sig in STOP_SIGNALS
            if not (sig in KEPT_IGNORED and signal.getsignal(sig) == signal.SIG_IGN)
        ]
        self.previous = {sig: signal.signal(sig, self.handle) for sig in caught}
        return self

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is None:
            log.warning(
                "%s received: saving a checkpoint after this update (several ranks: after the "
                "update where they next agree, trainer.agree_every), then stopping",
                name,
            )
            self.received = name
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if self.raising:
            self.raising = False  # once: what handles Interrupted runs undisturbed
            raise Interrupted(name)

    @contextlib.contextmanager
    def interrupting(self) -> Iterator[None]:
        """Work that a stop signal ends (raising Interrupted), also one received before it
        began: nothing of it is kept, and the caller goes on to the checkpoint."""
        if self.received is not None:
            raise Interrupted(self.received)
        self.raising = True
        try:
            yield
        finally:
            self.raising = False


def pass_on(name: str | None) -> None:
    """After a stop by the signal `name` (None: no signal reached this process) and its
    checkpoint: call the handler now installed for it, the one the trainer's replaced, where that
    is a Python function: a launcher's (submitit's requeues the job and exits). The default
    handler, an ignored signal and Ctrl-C's are left alone: the run has stopped as asked."""
    if name is None or name == signal.SIGINT.name:
        return
    number = signal.Signals[name]
    handler = signal.getsignal(number)
    if callable(handler):
        log.info("passing %s on to the handler that was installed before training", name)
        handler(number, None)


def ignore_stop_signals() -> None:
    """This process leaves stop signals to the training process (a DataLoader worker, the fork
    server that starts them: train/loader_workers.py)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def held_for_children() -> Iterator[None]:
    """Stop signals held back (blocked) in this thread while in it: a process started here (fork
    and exec) begins with them blocked, so a signal to the process group stays pending there
    until the process ignores the stop signals and unblocks them (`release_ignored`), as
    multiprocessing's resource tracker does for SIGINT and SIGTERM. One that reaches this
    process meanwhile is handled when they are released here: none is lost. (SIG_IGN set here
    for the child to inherit would drop one meant for this process.)"""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def release_ignored() -> None:
    """In a process started under `held_for_children`: ignore the stop signals, then unblock
    them (the pending ones are dropped: ignored)."""
    ignore_stop_signals()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
