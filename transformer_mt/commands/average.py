"""tmt-average: the mean of a run's newest checkpoints, as the paper averages its last 5 (base)
or 20 (big), written as a checkpoint that eval and translate load like any other."""

from __future__ import annotations

from pathlib import Path

from transformer_mt.checkpoint import average_checkpoints, is_training_checkpoint, save_checkpoint
from transformer_mt.config import AverageJob
from transformer_mt.errors import ConfigError
from transformer_mt.run_dir import RunDir


def average(job: AverageJob) -> tuple[list[Path], Path]:
    """Average the newest job.last step checkpoints; return them and the file written."""
    run = RunDir(job.run_dir)
    output = run.checkpoint(job.output)
    if output.parent.resolve() == run.checkpoints.path.resolve() and is_training_checkpoint(
        output.name
    ):
        raise ConfigError(
            f"config key 'output': {job.output} is the name of a training checkpoint, which an "
            "average (no optimizer state) must not replace; name another file, e.g. averaged.pt"
        )
    paths = run.checkpoints.newest_steps(job.last)
    save_checkpoint(average_checkpoints(paths), output)
    return paths, output
