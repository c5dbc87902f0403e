"""Command-line entry points; the only module with @hydra.main.

Each command composes its config from configs/, turns it into typed dataclasses and calls one
plain function. User mistakes (TransformerMTError) become one clear line and exit code 2.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator

import hydra
from omegaconf import DictConfig, OmegaConf
from tqdm.contrib.logging import logging_redirect_tqdm

from transformer_mt.config import (
    CONFIG_DIR,
    AverageJob,
    EvalJob,
    ExportJob,
    TrainJob,
    TranslateJob,
    register_configs,
)
from transformer_mt.errors import TransformerMTError

log = logging.getLogger("transformer_mt")
CONFIG_PATH = str(CONFIG_DIR)
register_configs()


def run_reporting_errors(task: Callable[[], None]) -> None:
    if not logging.getLogger().handlers:  # eval / translate: Hydra's logging is off, log to stderr
        logging.basicConfig(
            level=logging.INFO,
            stream=sys.stderr,
            format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s",
        )
    try:
        with logging_redirect_tqdm():
            task()
    except TransformerMTError as error:
        log.error("%s", error)
        sys.exit(2)


def to_job(cfg: DictConfig, schema: type):
    job = OmegaConf.to_object(cfg)
    assert isinstance(job, schema), f"config did not compose to {schema.__name__}"
    return job


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="train")
def prepare_main(cfg: DictConfig) -> None:
    """tmt-prepare: clean, tokenize and binarize the corpus only (tmt-train does it when needed)."""
    from pathlib import Path

    from transformer_mt.config import validate_train
    from transformer_mt.data.prepare import prepare

    def task() -> None:
        job = to_job(cfg, TrainJob)
        validate_train(job)
        data = prepare(job.data, Path(job.run_dir))
        log.info(
            "prepared data in %s: %d train, %d valid pairs; tokenizer copied to %s",
            data.folder,
            len(data.train),
            len(data.valid),
            job.run_dir,
        )

    run_reporting_errors(task)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="train")
def train_main(cfg: DictConfig) -> None:
    """tmt-train: prepare the data, train, checkpoint into run_dir."""
    from transformer_mt.train.run import train

    def task() -> None:
        started = time.perf_counter()
        checkpoint = train(to_job(cfg, TrainJob))
        log.info(
            "training finished in %.1f min wall time; checkpoint %s",
            (time.perf_counter() - started) / 60,
            checkpoint,
        )

    run_reporting_errors(task)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="average")
def average_main(cfg: DictConfig) -> None:
    """tmt-average: average the newest checkpoints of a run into one (the paper's last 5 / 20)."""
    from pathlib import Path

    from transformer_mt.train.average import average_checkpoints, newest_step_checkpoints
    from transformer_mt.train.checkpoint import resolve_checkpoint, save_checkpoint

    def task() -> None:
        job = to_job(cfg, AverageJob)
        run_dir = Path(job.run_dir)
        paths = newest_step_checkpoints(run_dir / "checkpoints", job.last)
        output = resolve_checkpoint(run_dir, job.output)
        save_checkpoint(average_checkpoints(paths), output)
        log.info("averaged %s into %s", ", ".join(p.name for p in paths), output)

    run_reporting_errors(task)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="export")
def export_main(cfg: DictConfig) -> None:
    """tmt-export: write a checkpoint as a CTranslate2 model folder (needs the `export` extra)."""
    from transformer_mt.export import export

    def task() -> None:
        output = export(to_job(cfg, ExportJob))
        log.info("CTranslate2 model written to %s", output)

    run_reporting_errors(task)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="eval")
def evaluate_main(cfg: DictConfig) -> None:
    """tmt-eval: translate a split with beam search and score it with sacreBLEU."""
    from transformer_mt.evaluate import evaluate

    def task() -> None:
        scores = evaluate(to_job(cfg, EvalJob))
        print(
            f"{scores['split']}: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  "
            f"({scores['sentences']} sentences, decoded in {scores['decode_seconds']:.1f} s)"
        )
        print(f"  {scores['bleu_detail']}")
        print(f"  sacreBLEU signature: {scores['bleu_signature']}")
        print(f"  chrF signature: {scores['chrf_signature']}")
        print(
            f"tokenized BLEU {scores['bleu_tokenized']:.2f} (approximates the paper's metric: "
            "intl tokenizer, not Moses; not sacreBLEU)"
        )
        print(f"  {scores['bleu_tokenized_detail']}")
        print(f"  signature: {scores['bleu_tokenized_signature']}")
        print(f"  {scores['bleu_tokenized_note']}")

    run_reporting_errors(task)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="translate")
def translate_main(cfg: DictConfig) -> None:
    """tmt-translate: lines of stdin or a file; translations (or n-best lists) to stdout or a
    file, flushed after each batch of lines."""
    from contextlib import ExitStack

    from transformer_mt.decode.translator import Translator

    def task() -> None:
        job = to_job(cfg, TranslateJob)
        translator = Translator.from_run(
            job.run_dir, job.checkpoint, decode=job.decode, device=job.device
        )
        with ExitStack() as files:
            if job.input is None:
                source, name = sys.stdin.buffer, "<stdin>"
            else:
                source, name = files.enter_context(open_input(job.input)), job.input
            if job.output is None:
                sys.stdout.reconfigure(encoding="utf-8")
                target = sys.stdout
            else:
                target = files.enter_context(open(job.output, "w", encoding="utf-8"))
            number = 0
            for lines in line_batches(source, name, 64):
                if job.decode.nbest > 1:
                    for nbest in translator.translate_nbest(lines):
                        for entry in nbest:
                            target.write(f"{number} ||| {entry.text} ||| {entry.score:.4f}\n")
                        number += 1
                else:
                    target.writelines(t + "\n" for t in translator.translate(lines))
                target.flush()

    run_reporting_errors(task)


def open_input(path: str):
    try:
        return open(path, "rb")
    except OSError as error:
        raise TransformerMTError(f"input={path}: {error.strerror}") from None


def line_batches(stream, name: str, size: int) -> Iterator[list[str]]:
    """Lines of a binary stream (UTF-8, split on newlines only) in batches of up to `size`."""
    batch: list[str] = []
    for number, raw in enumerate(stream, start=1):
        try:
            batch.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError:
            raise TransformerMTError(f"{name}:{number}: not valid UTF-8") from None
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
