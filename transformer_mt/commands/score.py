"""tmt-score: the model's score of each given translation, a line a pair (decode/scoring.py).

The source and target files are read together in chunks of CHUNK_LINES lines; each chunk's
scores are written as soon as they are computed (to standard output, or to output= beside its
file, renamed into place once every pair is scored: an input that fails halfway, a full disk
or a stop signal leaves the previous file as it was). Files of different line counts are
refused before the model loads. Progress: a bar of pairs with their rate and the time left on
a terminal, else a log line a minute.
"""

from __future__ import annotations

import math
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import TextIO

from transformer_mt.commands.progress import Progress
from transformer_mt.commands.translate import (
    check_distinct_files,
    check_output_folders,
    line_batches,
    open_input,
    stopped_by_signals,
    written_when_complete,
)
from transformer_mt.config import ScoreJob
from transformer_mt.data.sources import count_lines
from transformer_mt.decode.loading import load_translator
from transformer_mt.decode.scoring import PairScore, score_pairs
from transformer_mt.errors import ConfigError, DataError

CHUNK_LINES = 10_000


def score(job: ScoreJob) -> None:
    job.validate()  # before the model loads
    inputs = {"source": job.source, "target": job.target}
    for key, name in inputs.items():
        if not Path(name).is_file():
            raise ConfigError(f"config key '{key}': {name}: no such file")
    check_distinct_files({**inputs, "output": job.output}, reads_stdin=False)
    check_output_folders({"output": job.output})
    lines = {key: count_lines(Path(name)) for key, name in inputs.items()}
    if lines["source"] != lines["target"]:
        raise DataError(
            f"source={job.source} has {lines['source']} lines and target={job.target} "
            f"{lines['target']}: a pair is a line of each"
        )
    translator = load_translator(
        job.run_dir, job.checkpoint, decode=job.decode, device=job.device, weights=job.weights
    )
    with stopped_by_signals(), ExitStack() as files:
        sources = line_batches(files.enter_context(open_input(job.source)), job.source, CHUNK_LINES)
        targets = line_batches(files.enter_context(open_input(job.target)), job.target, CHUNK_LINES)
        if job.output is None:
            sys.stdout.reconfigure(encoding="utf-8")
            out: TextIO = sys.stdout
        else:
            out = files.enter_context(written_when_complete(Path(job.output)))
        progress = Progress(lines["source"], "scoring", "scored", "pairs")
        for source_lines, target_lines in zip(sources, targets, strict=True):
            scores = score_pairs(translator, source_lines, target_lines, decode=job.decode)
            out.writelines(score_line(pair) for pair in scores)
            out.flush()
            progress.advanced(len(source_lines))
        progress.close()


def score_line(pair: PairScore | None) -> str:
    """A pair's output line (ScoreJob.output); an unscored pair's scores are -inf."""
    if pair is None:
        return f"{-math.inf}\t{-math.inf}\t{-math.inf}\t0\n"
    return f"{pair.normalised:.6f}\t{pair.log_prob:.6f}\t{pair.per_piece:.6f}\t{pair.pieces}\n"
