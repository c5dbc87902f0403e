"""tmt-prepare: clean, tokenize and binarize the corpus of a training configuration, and give
the run folder its tokenizer (tmt-train does the same when it needs to)."""

from __future__ import annotations

from transformer_mt.config import TrainJob, validate_train
from transformer_mt.data.prepare import PreparedData
from transformer_mt.run_dir import RunDir


def prepare_run(job: TrainJob) -> PreparedData:
    validate_train(job)
    return RunDir(job.run_dir).prepare(job.data)
