"""The Checkpointer the Trainer composes (as torchtitan's trainer is given its checkpoint
manager): it saves the run's state as a checkpoint, resumes it, takes a parent's weights, and
keeps the run folder clean of interrupted writes. The checkpoint's contents are typed records
(checkpoint/record.py, checkpoint/training_state.py); whether a checkpoint fits this run was
decided before anything was written (train/start.py, through checkpoint.check_fits)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_mt.checkpoint import (
    Checkpoint,
    CheckpointRecord,
    Progress,
    RngStates,
    TrainingState,
    UpdateCounts,
)
from transformer_mt.checkpoint.training_state import has_moving_average
from transformer_mt.config import TrainerConfig
from transformer_mt.errors import CheckpointError
from transformer_mt.run_dir import RunDir
from transformer_mt.train.distributed import Ranks
from transformer_mt.train.moving_average import WeightAverage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingParts:
    """What a training checkpoint saves the state of: objects with state_dict / load_state_dict."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    ema: WeightAverage | None = None  # the moving average of the weights (trainer.ema_decay)


class Checkpointer:
    """When to save and the saving (`save_if_due`: the one place that decides it), resuming,
    and pruning the checkpoints of one run."""

    def __init__(
        self,
        run: RunDir,
        record: CheckpointRecord,
        parts: TrainingParts,
        ranks: Ranks,
        device: torch.device,
        settings: TrainerConfig,
    ):
        """record: what this run's checkpoints say of themselves (progress added when saved)."""
        self.run, self.folder, self.record = run, run.checkpoints, record
        self.parts, self.ranks, self.device, self.settings = parts, ranks, device, settings
        self.saved_step = -1  # the update last.pt holds (-1: none of this run yet)
        self.last_save_time = time.monotonic()  # of saved_step (a resume's: when it resumed)
        self.skipped_one = False  # a checkpoint_every checkpoint skipped (logged once)

    # ---- saving ------------------------------------------------------------------------------
    def save_if_due(
        self,
        progress: Progress,
        *,
        improved: bool = False,
        stopping: bool = False,
        clock_due: bool = False,
        last: bool = False,
        validated: bool = False,
    ) -> None:
        """Write the checkpoint of this update where a reason holds: a new best validation score
        (`improved`), a stop signal (`stopping`), rank 0's trainer.checkpoint_every_minutes clock
        as the ranks agreed it (`clock_due`: StopRules.agree), a trainer.checkpoint_every update
        spaced enough from the previous checkpoint (`periodic_due`); and the `last` update, the
        run's end state, where last.pt does not hold it yet, or holds it without the validation
        just `validated` (a checkpoint written as a stop signal cut that validation short). A
        collective: every rank calls it with the same arguments (each agreed)."""
        if improved or stopping or clock_due:
            due = True
        elif last:
            due = validated or self.saved_step != progress.step
        else:
            due = self.periodic_due(progress.step)
        if due:
            self.save(progress, best=improved)

    def state(self, progress: Progress) -> dict:
        """The run's whole state as a checkpoint's dict; a collective (every rank's RNG)."""
        parts = self.parts
        state = TrainingState(
            model=parts.model.state_dict(),
            optimizer=parts.optimizer.state_dict(),
            scheduler=parts.scheduler.state_dict(),
            scaler=parts.scaler.state_dict(),
            rng=gathered_rng(self.ranks, self.device),
            ema=None if parts.ema is None else parts.ema.state(self.ranks),
        )
        return {**state.as_state(), **self.record.with_progress(progress).as_state()}

    def save(self, progress: Progress, *, best: bool = False) -> Path:
        """Write the checkpoint of this update (rank 0; a collective: every rank calls it)."""
        state = self.state(progress)
        path = self.folder.step_file(progress.step)
        if self.ranks.is_main:
            started = time.perf_counter()
            path = self.folder.save(
                state,
                progress.step,
                best=best,
                keep=self.settings.keep_checkpoints,
                previous=self.saved_step,
            )
            log.info(  # path: last.pt where keep_checkpoints=0 pruned the step file
                "wrote %s (%.0f MB) in %.2f s",
                path.name,
                path.stat().st_size / 1e6,
                time.perf_counter() - started,
            )
        self.saved_step = progress.step
        self.last_save_time = time.monotonic()
        return path

    def periodic_due(self, step: int) -> bool:
        """Whether update `step` is one trainer.checkpoint_every asks a checkpoint at, and
        trainer.checkpoint_min_seconds have passed since the last checkpoint by rank 0's clock.
        At such updates a collective (a broadcast of rank 0's answer), which every rank meets at
        the same update: save_if_due asks only where the agreed reasons to save are all false."""
        every = self.settings.checkpoint_every
        if not every or step % every:
            return False
        (spaced,) = self.ranks.broadcast([float(self.spaced_enough())])
        if not spaced and not self.skipped_one and self.ranks.is_main:
            log.info(
                "no checkpoint at update %d, %.1f s after the previous one (update %d): "
                "checkpoints for trainer.checkpoint_every=%d keep "
                "trainer.checkpoint_min_seconds=%g apart",
                step,
                time.monotonic() - self.last_save_time,
                self.saved_step,
                every,
                self.settings.checkpoint_min_seconds,
            )
            self.skipped_one = True
        return spaced > 0

    def spaced_enough(self) -> bool:
        """Whether trainer.checkpoint_min_seconds have passed since the last checkpoint (the one
        written last, or the one this run resumed, counted from the resume); True before any."""
        if self.saved_step < 0:
            return True
        return time.monotonic() - self.last_save_time >= self.settings.checkpoint_min_seconds

    def time_due(self) -> bool:
        """Whether trainer.checkpoint_every_minutes have passed since the last checkpoint (this
        rank's clock: the ranks agree on rank 0's, StopRules.agree)."""
        minutes = self.settings.checkpoint_every_minutes
        return bool(minutes) and time.monotonic() - self.last_save_time >= 60 * minutes

    # ---- starting ----------------------------------------------------------------------------
    def remove_partial_writes(self) -> None:
        """What interrupted writes left in the run folder, removed by rank 0 before any rank
        goes on."""
        if self.ranks.is_main:
            for path in self.run.remove_partial_training_writes():
                log.info("removed %s, left by an interrupted write", path.name)
        self.ranks.barrier()

    def resume(self, checkpoint: Checkpoint) -> Progress:
        """Load the checkpoint's model, optimizer, schedule, scaler and random generators into
        this run (train/start.py checked that it fits); return its progress."""
        state, path = checkpoint.training_state(), checkpoint.path
        parts = self.parts
        try:
            parts.model.load_state_dict(state.model)
            parts.optimizer.load_state_dict(state.optimizer)
            parts.scheduler.load_state_dict(state.scheduler)
        except (RuntimeError, ValueError, KeyError) as error:
            raise CheckpointError(f"{path}: cannot continue from it: {error}") from error
        if state.scaler:
            parts.scaler.load_state_dict(state.scaler)
        if parts.ema is not None and state.ema is not None:
            parts.ema.load(state.ema)
        elif parts.ema is not None and self.ranks.is_main:  # trainer.ema_decay set since
            log.warning("%s has no moving average of its weights: it starts here", path.name)
        elif state.ema is not None and self.ranks.is_main:  # trainer.ema_decay=0 since
            log.warning(
                "%s has a moving average of its weights, and trainer.ema_decay=0: it is dropped, "
                "and this run's checkpoints hold none",
                path.name,
            )
        progress = checkpoint.record.progress or Progress(UpdateCounts(step=checkpoint.record.step))
        if not restore_rng(state.rng, self.ranks, self.device, self.settings.seed, progress.step):
            log.warning("another number of ranks: dropout draws fresh random numbers")
        self.relink_last(path, progress.step)
        self.relink_best(progress.validation.best_step)
        return progress

    def relink_last(self, path: Path, step: int) -> None:
        """last.pt at the checkpoint resumed, `path` of update `step` (rank 0 decides, every
        rank learns: saved_step says whether the end must write a checkpoint); where `path`
        lies outside this run's folder, the end writes one even with no update done."""
        holds = 0.0
        if self.ranks.is_main:
            holds = float(self.folder.point_last_at(path, step))
        (holds,) = self.ranks.broadcast([holds])
        self.saved_step = step if holds else -1
        self.last_save_time = time.monotonic()

    def relink_best(self, best_step: int | None) -> None:
        """The best checkpoint's link at the checkpoint of the recorded best score (rank 0; see
        CheckpointFolder.point_best_at)."""
        if self.ranks.is_main and best_step is not None and self.folder.point_best_at(best_step):
            log.info(
                "%s now points at update %d, the recorded best", self.folder.best.name, best_step
            )

    def take_weights(self, checkpoint: Checkpoint) -> None:
        """A parent's model weights only (fine-tuning): optimizer, schedule and update count
        start afresh. The parent's shape and vocabulary were checked before any write."""
        try:
            self.parts.model.load_state_dict(checkpoint.weights())
        except RuntimeError as error:
            raise CheckpointError(f"{checkpoint.path}: cannot take its weights: {error}") from error
        if has_moving_average(checkpoint.state) and self.ranks.is_main:
            log.info("fine-tuning from %s's moving average of its weights", checkpoint.path.name)


def gathered_rng(ranks: Ranks, device: torch.device) -> RngStates:
    """Every rank's RNG states: the CPU's and the GPU's (CUDA or MPS) that dropout draws from (a
    collective: all ranks call it)."""
    cpu = ranks.gather(torch.get_rng_state())
    if device.type == "cuda":
        return RngStates(cpu=cpu, cuda=ranks.gather(torch.cuda.get_rng_state(device)))
    if device.type == "mps":
        return RngStates(cpu=cpu, mps=ranks.gather(torch.mps.get_rng_state()))
    return RngStates(cpu=cpu)


def restore_rng(saved: RngStates, ranks: Ranks, device: torch.device, seed: int, step: int) -> bool:
    """This rank's saved RNG states; with another number of ranks, fresh seeds (returns False)."""
    if len(saved.cpu) != ranks.world_size:
        torch.manual_seed(seed + 1_000_003 * (step + 1) + ranks.rank)
        return False
    torch.set_rng_state(saved.cpu[ranks.rank])
    on_device = saved.of_device(device.type)
    if len(on_device) == ranks.world_size:
        if device.type == "cuda":
            torch.cuda.set_rng_state(on_device[ranks.rank], device)
        elif device.type == "mps":
            torch.mps.set_rng_state(on_device[ranks.rank])
    return True
