"""Why a training run ends, in one place: `StopRules.reason` names the first reason that holds,
in this order: a stop signal (train/signals.py catches it), patience used up (the validator's
verdict), a diverged run (non-finite gradients, or fp16's loss scale collapsed), then
trainer.max_steps, trainer.max_epochs and trainer.max_time_minutes (and, as a guard, the end of
the training batches, which end only at trainer.max_epochs).

A signal or a clock that reached one rank must not send the ranks down different paths: the
ranks agree on both in one all-reduce every trainer.agree_every updates (`agree`), which also
carries rank 0's checkpoint clock (the Checkpointer's `time_due`), so that no second collective
is needed for it. Everything else a rule reads is the same on every rank by construction."""

from __future__ import annotations

import torch

from transformer_mt.checkpoint import Progress
from transformer_mt.config import TrainerConfig
from transformer_mt.train.distributed import Ranks
from transformer_mt.train.signals import StopSignals

# fp16: a loss scale below this (fairseq's --min-loss-scale default) means the gradient
# overflows however far it is scaled down: the run has diverged.
MIN_LOSS_SCALE = 1e-4


class StopRules:
    """The rules that end a run, what they have learnt so far, and the stop signals they catch
    while installed (a context manager, until the end state is saved)."""

    def __init__(self, settings: TrainerConfig, ranks: Ranks, scaler: torch.amp.GradScaler):
        self.settings, self.ranks, self.scaler = settings, ranks, scaler
        self.signals = StopSignals()
        # Agreed by all ranks (agree): a stop signal reached a rank; a rank is out of time.
        self.signalled = self.out_of_time = False
        self.diverged: str | None = None  # why the gradient says the run has diverged
        self.exhausted = False  # the validator's patience is used up
        self.data_ended = False  # the training batches ended (at trainer.max_epochs)

    def __enter__(self) -> StopRules:
        self.signals.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self.signals.__exit__(*exc_info)

    def reason(self, progress: Progress) -> str | None:
        """Why the run ends now, or None while it goes on."""
        settings = self.settings
        if self.signalled:
            return f"stop signal ({self.signals.received or 'on another rank'})"
        if self.exhausted:
            return (
                f"no better validation score in {settings.patience} validations (trainer.patience)"
            )
        if self.diverged:
            return self.diverged
        if settings.max_steps and progress.step >= settings.max_steps:
            return f"reached trainer.max_steps={settings.max_steps}"
        if settings.max_epochs and progress.position.epoch >= settings.max_epochs:
            return f"reached trainer.max_epochs={settings.max_epochs}"
        if self.out_of_time:
            return f"reached trainer.max_time_minutes={settings.max_time_minutes}"
        if self.data_ended:  # only where epoch_limit did not hold: a guard against looping
            return "training data exhausted"
        return None

    @property
    def epoch_limit(self) -> int:
        """The epoch the training data ends before (0: none): trainer.max_epochs. The data ends
        there (TrainingBatches.updates), so the last epoch's last update takes no micro-batch
        of the next, and `reason` names it."""
        return self.settings.max_epochs

    def start(self, train_seconds: float) -> None:
        """The clock's first reading: every rank resumed the same saved training time, so it
        is shared without asking."""
        self.out_of_time = self.time_is_up(train_seconds)

    def time_is_up(self, train_seconds: float) -> bool:
        """This rank's view: trainer.max_time_minutes of training time spent."""
        limit = 60 * self.settings.max_time_minutes
        return bool(limit) and train_seconds >= limit

    def minutes_left(self, train_seconds: float) -> float | None:
        """Of trainer.max_time_minutes (None: no time limit), for the progress bar."""
        limit = self.settings.max_time_minutes
        return max(limit - train_seconds / 60, 0.0) if limit else None

    def agree(self, step: int, train_seconds: float, checkpoint_due: bool) -> bool:
        """One all-reduce every trainer.agree_every updates (after each update for a lone
        process, which asks nobody): stop when any rank has a stop signal or is out of time;
        checkpoint when rank 0's clock says so (`checkpoint_due`: the Checkpointer's
        time_due). Between agreements every rank goes on as agreed last, so all stop (and
        checkpoint) at the same update, at most agree_every - 1 updates after the signal or
        the clock. Returns whether to checkpoint for time."""
        if self.ranks.distributed and step % self.settings.agree_every:
            return False
        signalled, out_of_time, checkpoint_due_main = self.ranks.sum(
            [
                float(self.signals.received is not None),
                float(self.time_is_up(train_seconds)),
                float(checkpoint_due and self.ranks.is_main),
            ]
        )
        self.signalled, self.out_of_time = signalled > 0, out_of_time > 0
        return checkpoint_due_main > 0

    def check_gradients(self, in_a_row: int) -> None:
        """At a log (where the count of non-finite updates is read): whether the run has
        diverged, `in_a_row` updates in a row having had a non-finite gradient."""
        if self.scaler.is_enabled():
            # fp16: the scaler skips updates while it lowers the loss scale, by design (several in
            # a row at the start); a run has diverged only when the scale has collapsed.
            scale = self.scaler.get_scale()
            if scale < MIN_LOSS_SCALE:
                self.diverged = (
                    f"the fp16 loss scale fell to {scale:.3g} (below {MIN_LOSS_SCALE:g}): the "
                    "gradient overflows whatever the scale; lower optim.lr_scale, set "
                    "optim.clip_norm, or train in bf16 / fp32; the checkpoints before this point "
                    "are good"
                )
            return
        limit = self.settings.max_nonfinite_updates
        if in_a_row >= limit:
            self.diverged = (
                f"{in_a_row} updates in a row had a non-finite gradient and were skipped "
                f"(trainer.max_nonfinite_updates={limit}): lower optim.lr_scale, set "
                "optim.clip_norm, or train in fp32/bf16; the checkpoints before this point are good"
            )
