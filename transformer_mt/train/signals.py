"""Stop requests by signal: a cluster's pre-emption (SIGTERM; SIGUSR1 or SIGUSR2, which Slurm
sends ahead of a job's time limit with --signal, SIGUSR2 for submitit's jobs) or Ctrl-C (SIGINT).

The training loop asks `received` at the end of each update (with several ranks, at their next
agreement, every trainer.agree_every updates: all stop at the same update), saves a checkpoint
and exits cleanly. A second Ctrl-C interrupts at once (Python's default), for a user who will not
wait. Once the checkpoint is written, `pass_on` gives the signal to the handler that was there
before, where a launcher installed one (submitit requeues the job from it).
"""

from __future__ import annotations

import logging
import signal

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)


class StopSignals:
    """While installed (a context manager), records the first stop signal instead of dying."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        self.previous = {sig: signal.signal(sig, self.handle) for sig in STOP_SIGNALS}
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
