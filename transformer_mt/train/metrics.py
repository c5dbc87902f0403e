"""What the trainer reports, on rank 0: a log line, TensorBoard scalars and the progress bar's
figures for each window of updates, validation scores, and torch.compile's counts (the Trainer
composes one TrainingMetrics; the measurements themselves are train/monitor.py's)."""

from __future__ import annotations

import logging

import torch
from torch.utils.tensorboard import SummaryWriter

from transformer_mt.checkpoint import Progress
from transformer_mt.train.compiling import CompileWatch
from transformer_mt.train.flops import peak_flops
from transformer_mt.train.monitor import StepStats, WindowStats
from transformer_mt.train.validation import ValidationScores

log = logging.getLogger(__name__)


class TrainingMetrics:
    """Rank 0's reports of a run (TensorBoard events in the run folder's tensorboard/)."""

    def __init__(self, tensorboard: str, device: torch.device, *, compiled: bool):
        self.writer = SummaryWriter(tensorboard)
        self.device = device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        self.peak_flops = peak_flops(name) if name else None
        self.compile_watch = CompileWatch() if compiled else None

    def window(
        self, updates: list[StepStats], seconds: float, progress: Progress, waited: float = 0.0
    ) -> WindowStats:
        """Report the updates since the last log (a host sync), with the non-finite updates so
        far; waited: the seconds of it spent waiting for the data."""
        stats = WindowStats.of(updates, seconds, self.peak_flops, waited)
        counts = progress.counts
        scalars = {**stats.scalars(), "skipped_updates": counts.skipped_updates}
        if self.device.type == "cuda":
            scalars["memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        for name, value in scalars.items():
            self.writer.add_scalar(f"train/{name}", value, progress.step)
        log.info("%s", stats.format(progress.step, progress.position.epoch, counts.train_seconds))
        if self.compile_watch is not None:
            self.compile_watch.check(progress.step)  # logs the counts when they changed
            compiled = self.compile_watch.last
            self.writer.add_scalar("compile/graphs", compiled.graphs, progress.step)
            self.writer.add_scalar("compile/recompiles", compiled.recompiles, progress.step)
        return stats

    def validation(self, scores: ValidationScores, step: int) -> None:
        for name, value in scores.scalars().items():
            self.writer.add_scalar(f"valid/{name}", value, step)
        log.info("%s", scores.format(step))

    def close(self) -> None:
        self.writer.close()
