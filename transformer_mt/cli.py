"""Command-line entry points; the only module with @hydra.main.

Each command composes its config from the presets in transformer_mt/configs/, turns it into a
typed job and calls the plain function of its module in commands/. User mistakes
(TransformerMTError, a configuration Hydra refuses: config.config_error_line, and a file system
that refuses a write: `os_error_line`) become one clear line and exit code 2; a stop signal that
ended a command with nothing to save (errors.Stopped) one line and 128 + the signal's number;
nothing else happens here. tmt-train returns the run's best validation score to Hydra, for a
sweeper to optimise; under a sweep a job refused or diverged is a failed trial, and the sweep
goes on.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from tqdm.contrib.logging import logging_redirect_tqdm

from transformer_mt.config import (
    CONFIG_DIR,
    AverageJob,
    BacktranslateJob,
    EvalJob,
    ExportJob,
    ScoreJob,
    ServeJob,
    TrainJob,
    TranslateJob,
    as_job,
    config_error_line,
    register_configs,
)
from transformer_mt.errors import Stopped, TransformerMTError
from transformer_mt.run_dir import RunDir
from transformer_mt.sweeps import check_evaluation_paths, check_job_paths, swept_keys

log = logging.getLogger("transformer_mt")
CONFIG_PATH = str(CONFIG_DIR)
JOBS_APART = "hydra_plugins.hydra_submitit_launcher."
"""Launchers that run each job in processes of their own: a job stopped by a signal ends
alone (its launcher requeues it), where in one process it ends the sweep."""
FAILED_TRIAL = None
"""What a sweep job that was refused or diverged returns: no score. Optuna's sweeper tells the
trial as failed ("Return value must be float-castable") and goes on, whatever
hydra.sweeper.max_failure_rate says; Hydra's basic sweeper records it. An exception would end
the sweep instead (SystemExit; and Optuna re-raises a job's exception at its default
max_failure_rate=0), and so would NaN (hydra-optuna-sweeper 1.3 then tells the failed trial
with a value, which Optuna refuses)."""
register_configs()


def log_to_stderr() -> None:
    if not logging.getLogger().handlers:  # Hydra's logging is off: log to stderr
        logging.basicConfig(
            level=logging.INFO,
            stream=sys.stderr,
            format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s",
        )


def config_errors_exit_2(main: Callable[[], object]) -> Callable[[], object]:
    """The console command `main` (a @hydra.main function), with a configuration that Hydra
    refuses before the command starts (a value of the wrong type, an unknown key or preset, an
    override that does not parse) as one line naming the key and exit code 2, as for the
    project's own checks, where Hydra prints several lines and exits 1, as for a crash. Hydra
    hands its errors over under HYDRA_FULL_ERROR=1; a user who set it gets the traceback. A crash
    is printed as Hydra prints it: from the command's own frames on, exit 1."""

    @functools.wraps(main)
    def command(*args, **kwargs):
        log_to_stderr()  # also the sweeper's and launcher's lines (Hydra's logging is off)
        if os.environ.get("HYDRA_FULL_ERROR"):
            return main(*args, **kwargs)
        os.environ["HYDRA_FULL_ERROR"] = "1"
        try:
            return main(*args, **kwargs)
        except Exception as error:
            line = config_error_line(error)
            if line is None:
                print_from_the_command(error)
                sys.exit(1)
            log.error("%s", line)
            sys.exit(2)

    return command


def print_from_the_command(error: BaseException) -> None:
    """A crash's traceback from the frames below Hydra's run_job on (the command's own), as
    Hydra prints it without HYDRA_FULL_ERROR; whole where run_job is not among them."""
    frames = error.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_name != "run_job":
        frames = frames.tb_next
    below = frames.tb_next if frames is not None else error.__traceback__
    traceback.print_exception(type(error), error, below)


def run_reporting_errors(task: Callable[[], object]) -> object:
    log_to_stderr()
    try:
        with logging_redirect_tqdm():
            return task()
    except TransformerMTError as error:
        log.error("%s", error)
        log.debug("the error's origin (hydra.verbose=true shows this):", exc_info=error)
        sys.exit(2)
    except OSError as error:
        line = os_error_line(error)
        if line is None:
            raise
        log.error("%s", line)
        sys.exit(2)
    except Stopped as stopped:  # a command with nothing to save (tmt-translate)
        log.error("%s: nothing was left half-written", stopped)
        sys.exit(128 + stopped.signum)


def os_error_line(error: OSError) -> str | None:
    """The one line for a file system that refuses a write (full, read-only, not ours to
    write); None for any other OSError (a crash: its traceback). Every file is written beside
    its target and renamed when complete, so the previous version of whatever was being
    written is left as it was."""
    where = f" writing {error.filename}" if error.filename else ""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"the disk is full ({error.strerror}{where}): nothing was left half-written; free "
            "space and rerun"
        )
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        what = f": {error.filename}" if error.filename else ""
        return (
            f"{error.strerror}{what}: nothing was left half-written; name a writable place, or "
            "make this one writable, and rerun"
        )
    return None


def sweep_keys(hydra_cfg: DictConfig) -> set[str]:
    """The keys the running sweep varies (sweeps.swept_keys): of the command line's overrides,
    read as hydra.main read them (Hydra's own argument parser: a job's config keeps its own
    values only), and of the sweeper's params."""
    from hydra._internal.utils import get_args_parser

    overrides = get_args_parser().parse_known_args(sys.argv[1:])[0].overrides
    params = OmegaConf.select(hydra_cfg, "sweeper.params", default=None)
    return swept_keys(overrides, OmegaConf.to_container(params) if params else None)


@config_errors_exit_2
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="train")
def prepare_main(cfg: DictConfig) -> None:
    """tmt-prepare: clean, tokenize and binarize the corpus only (tmt-train does it when needed)."""
    from transformer_mt.commands.prepare import prepare_run

    def task() -> None:
        job = as_job(cfg, TrainJob)
        data = prepare_run(job)
        others = "".join(f"; corpus {e.name}: {len(e.train)} in {e.folder}" for e in data.extra)
        log.info(
            "prepared data in %s: %d train, %d valid pairs%s; tokenizer copied to %s",
            data.folder,
            len(data.train),
            len(data.valid),
            others,
            job.run_dir,
        )

    run_reporting_errors(task)


@config_errors_exit_2
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="train")
def train_main(cfg: DictConfig) -> float | None:
    """tmt-train: prepare the data, train, checkpoint into run_dir. Returns the best validation
    score (what best.pt was chosen by: valid BLEU where computed, else minus the valid loss), for
    a sweeper (Optuna's: hydra.sweeper.direction=maximize) to optimise; under a sweep, a job
    refused (one line) or diverged returns FAILED_TRIAL."""
    from transformer_mt.commands.train import train

    def task() -> float | None:
        started = time.perf_counter()
        hydra_cfg = HydraConfig.get()
        sweeping = hydra_cfg.mode == RunMode.MULTIRUN
        check_job_paths(cfg, multirun=sweeping)
        job = as_job(cfg, TrainJob)
        overrides = list(hydra_cfg.overrides.task)
        if sweeping:  # Hydra's folder for the job: <run_dir>-sweep/N, or the command line's
            job.run_dir = hydra_cfg.runtime.output_dir  # run_dir (transformer_mt/sweeps.py)
            log.info("sweep job %d: %s in %s", hydra_cfg.job.num, " ".join(overrides), job.run_dir)
        try:
            checkpoint = train(job, overrides)
        except TransformerMTError as error:
            if not sweeping:
                raise
            log.error("sweep job %d failed, the sweep goes on: %s", hydra_cfg.job.num, error)
            with contextlib.suppress(OSError):  # Hydra made the job's folder; a refusal left
                os.rmdir(job.run_dir)  # it empty (rmdir removes nothing else)
            return FAILED_TRIAL
        end = RunDir(job.run_dir).history()[-1]
        if sweeping and end["how"] == "stop signal":
            if str(hydra_cfg.launcher._target_).startswith(JOBS_APART):
                return None  # submitit's handler has had the signal: it requeues the job
            log.warning(
                "stopped by a signal: the sweep ends at job %d (the same command resumes it: "
                "finished jobs return their best score, this one continues)",
                hydra_cfg.job.num,
            )
            sys.exit(0)
        if sweeping and end["how"] == "diverged":  # its best score is from before: not a result
            log.warning("sweep job %d diverged: a failed trial to the sweeper", hydra_cfg.job.num)
            return FAILED_TRIAL
        best = end["best"]
        log.info(
            "training finished in %.1f min wall time; checkpoint %s; best %s %s at update %s",
            (time.perf_counter() - started) / 60,
            checkpoint,
            best["metric"],
            "none" if best["score"] is None else f"{best['score']:.4g}",
            best["step"],
        )
        return best["score"]

    return run_reporting_errors(task)


@config_errors_exit_2
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="average")
def average_main(cfg: DictConfig) -> None:
    """tmt-average: average the newest checkpoints of a run into one (the paper's last 5 / 20)."""
    from transformer_mt.commands.average import average

    def task() -> None:
        paths, output = average(as_job(cfg, AverageJob))
        log.info("averaged %s into %s", ", ".join(p.name for p in paths), output)

    run_reporting_errors(task)


@config_errors_exit_2
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="export")
def export_main(cfg: DictConfig) -> None:
    """tmt-export: write a checkpoint as a CTranslate2 model folder (the `export` extra) or,
    with format=transformers, as a transformers MarianMTModel folder (the `hf` extra)."""
    from transformer_mt.commands.export import export

    def task() -> None:
        job = as_job(cfg, ExportJob)
        output = export(job)
        log.info("%s model written to %s", job.format.value, output)

    run_reporting_errors(task)


@config_errors_exit_2
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="eval")
def evaluate_main(cfg: DictConfig) -> None:
    """tmt-eval: translate a split with beam search and score it with sacreBLEU."""
    from transformer_mt.commands.evaluate import evaluate_pairs, pairs_summary

    def task() -> None:
        hydra_cfg = HydraConfig.get()
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
        check_job_paths(cfg, multirun=multirun)
        if multirun:  # every job writes into its run_dir
            check_evaluation_paths(cfg, sweep_keys(hydra_cfg))
        reports = evaluate_pairs(as_job(cfg, EvalJob))
        print("\n".join(report.format() for report in reports))
        if len(reports) > 1:
            print(pairs_summary(reports))

    run_reporting_errors(task)


@config_errors_exit_2
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="translate")
def translate_main(cfg: DictConfig) -> None:
    """tmt-translate: lines of stdin or a file; translations (or n-best lists) to stdout or a
    file, flushed after each batch of lines."""
    from transformer_mt.commands.translate import translate

    def task() -> None:
        hydra_cfg = HydraConfig.get()
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
        swept = sweep_keys(hydra_cfg) if multirun else set()
        outputs = ("output", "attention", "alignment")
        check_job_paths(cfg, multirun=multirun, outputs=outputs, swept=swept)
        translate(as_job(cfg, TranslateJob))

    run_reporting_errors(task)


@config_errors_exit_2
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="backtranslate")
def backtranslate_main(cfg: DictConfig) -> None:
    """tmt-backtranslate: monolingual text to a synthetic parallel corpus, in chunks that the
    same command continues after a kill."""
    from transformer_mt.commands.backtranslate import backtranslate

    run_reporting_errors(lambda: backtranslate(as_job(cfg, BacktranslateJob)))


@config_errors_exit_2
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="score")
def score_main(cfg: DictConfig) -> None:
    """tmt-score: the model's score of each given translation (source= and target= files)."""
    from transformer_mt.commands.score import score

    run_reporting_errors(lambda: score(as_job(cfg, ScoreJob)))


@config_errors_exit_2
@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="serve")
def serve_main(cfg: DictConfig) -> None:
    """tmt-serve: an HTTP API and a page around one model (needs the `serve` extra)."""
    from transformer_mt.commands.serve import serve

    run_reporting_errors(lambda: serve(as_job(cfg, ServeJob)))
