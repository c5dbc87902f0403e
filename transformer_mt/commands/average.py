"""tmt-average: the mean of a run's newest checkpoints, as the paper averages its last 5 (base)
or 20 (big), written as a checkpoint that eval and translate load like any other."""

from __future__ import annotations

from pathlib import Path

from transformer_mt.checkpoint import average_checkpoints, newest_step_checkpoints, save_checkpoint
from transformer_mt.config import AverageJob
from transformer_mt.run_dir import RunDir


def average(job: AverageJob) -> tuple[list[Path], Path]:
    """Average the newest job.last step checkpoints; return them and the file written."""
    run = RunDir(job.run_dir)
    paths = newest_step_checkpoints(run.checkpoints, job.last)
    output = run.checkpoint(job.output)
    save_checkpoint(average_checkpoints(paths), output)
    return paths, output
