"""tmt-prepare: clean, tokenize and binarize the corpus of a training configuration, and give
the run folder its tokenizer (tmt-train does the same when it needs to)."""

from __future__ import annotations

from transformer_mt.config import TrainJob
from transformer_mt.data.prepare import PreparedData
from transformer_mt.run_dir import RunDir
from transformer_mt.train.start import use_parent_tokenizer


def prepare_run(job: TrainJob) -> PreparedData:
    """What tmt-train would prepare for `job` (with trainer.init_from, the parent's tokenizer),
    under the run folder's lock."""
    job.validate()
    run = RunDir(job.run_dir)
    with run.lock():
        use_parent_tokenizer(job)
        return run.prepare(job.data)
