"""tmt-train: every rank prepares (rank 0 builds), trains, validates and checkpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch

from transformer_mt import __version__
from transformer_mt.config import DECODE_PRECISIONS, CpuLinear, DecodeConfig, Precision, TrainJob
from transformer_mt.data.corpora import language_pairs, prepare_corpora, raw_pairs
from transformer_mt.data.prepare import PreparedData, prepared_folder, wait_until_prepared
from transformer_mt.data.tags import TargetLanguages
from transformer_mt.decode.translator import Translator
from transformer_mt.errors import ConfigError, DataError, OutOfMemory, TransformerMTError
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.metrics import sacrebleu_scores
from transformer_mt.model import Transformer, count_parameters
from transformer_mt.run_dir import RunDir
from transformer_mt.train import signals
from transformer_mt.train.distributed import Ranks, ending_together, start_ranks
from transformer_mt.train.start import Start, StartKind, plan_start, use_parent_tokenizer
from transformer_mt.train.trainer import Trainer

log = logging.getLogger(__name__)


def train(cfg: TrainJob, overrides: list[str] | None = None) -> Path:
    """Prepare data, train, validate and checkpoint into cfg.run_dir; return the last checkpoint.
    With several ranks every rank calls it; rank 0 holds the run folder's lock, prepares data and
    writes files. `overrides`: the command line's, for the run's history. After a stop by
    signal the signal goes on to a launcher's handler, if one was installed (signals.pass_on:
    submitit requeues the job from it)."""
    cfg.validate()
    ranks, device = start_ranks(
        cfg.trainer.device, cfg.trainer.rank_timeout_minutes, cfg.trainer.num_threads
    )
    run = RunDir(cfg.run_dir)
    with ending_together(ranks):  # a failing rank ends the others at once, its cause first
        policy = ExecutionPolicy.for_training(cfg.trainer, device)  # before any write
        with contextlib.ExitStack() as held:
            refusal = lock_run(run, ranks, held)
            last, stop_signal = train_ranks(cfg, run, ranks, policy, overrides or [], refusal)
        # Leave together: a rank that tears its connections down while another is still in its
        # last collectives (rank 0 validates and saves last) can abort that rank at exit.
        ranks.barrier()
    signals.pass_on(stop_signal)
    return last


def lock_run(run: RunDir, ranks: Ranks, held: contextlib.ExitStack) -> TransformerMTError | None:
    """Rank 0 takes the run folder's lock, held until `held` closes; returns its refusal (the
    folder in use by another run, or one that cannot be locked), which the other ranks learn
    where they agree on the start (agreed_start), so that each ends with the reason in one line
    instead of a broken connection; None where it holds the lock, and on the other ranks."""
    if not ranks.is_main:
        return None
    try:
        held.enter_context(run.lock())
    except TransformerMTError as refusal:
        return refusal
    return None


def train_ranks(
    cfg: TrainJob,
    run: RunDir,
    ranks: Ranks,
    policy: ExecutionPolicy,
    overrides: list[str],
    refusal: TransformerMTError | None = None,
) -> tuple[Path, str | None]:
    """`refusal`: rank 0's refusal of the run folder (lock_run), which ends every rank."""
    # Absolute paths, so that eval and translate find the corpus from any working directory.
    cfg.data.prepared_dir = str(Path(cfg.data.prepared_dir).resolve())
    if cfg.data.dir is not None:
        cfg.data.dir = str(Path(cfg.data.dir).resolve())
    for name, corpus in cfg.data.corpora.items():
        if isinstance(corpus, dict) and corpus.get("dir") is not None:
            cfg.data.corpora[name] = {**corpus, "dir": str(Path(corpus["dir"]).resolve())}
    use_parent_tokenizer(cfg)
    # Every check before the first write: a refused command leaves the run folder as it was.
    start = agreed_start(cfg, run, ranks, policy.precision, refusal)
    if not ranks.is_main:
        logging.getLogger("transformer_mt").setLevel(logging.WARNING)
        return train_started(cfg, run, start, ranks, policy, overrides)
    with log_to_file(run.path / run.LOG):
        for difference in start.changed:
            log.info("changed since the previous start: %s", difference)
        if start.forced:
            log.warning(
                "trainer.resume=force: this run continues with other training settings (%s)",
                ", ".join(str(difference) for difference in start.forced),
            )
        return train_started(cfg, run, start, ranks, policy, overrides)


def agreed_start(
    cfg: TrainJob,
    run: RunDir,
    ranks: Ranks,
    precision: str,
    refusal: TransformerMTError | None = None,
) -> Start:
    """This rank's start (train/start.plan_start), once every rank has planned the same one: the
    same prepared folder (another corpus or setting on one node would make the others wait for
    a folder that never appears) and the same checkpoint (a stale listing on one node must not
    resume another step). Every rank raises when one refuses (`refusal`: this rank's already,
    rank 0's of the run folder) or when they differ."""
    folder, start = None, None
    if refusal is None:
        try:
            folder = prepared_folder(cfg.data)
            start = plan_start(cfg, run, folder, precision)
        except TransformerMTError as error:
            refusal = error
    resumed = f"{start.path} (update {start.step})" if start and start.path else "none"
    name = folder.name if folder else ""
    mine = {"refused": str(refusal or ""), "prepared folder": name, "checkpoint": resumed}
    views = [json.loads(view) for view in ranks.gather_text(json.dumps(mine))]
    if refusal is not None:
        raise refusal
    for rank, view in enumerate(views):
        if view["refused"]:
            raise TransformerMTError(
                f"rank {rank} cannot start, so no rank does: {view['refused']}"
            )
    for key in ("prepared folder", "checkpoint"):
        if len({view[key] for view in views}) > 1:
            listing = "; ".join(f"rank {rank}: {view[key]}" for rank, view in enumerate(views))
            raise ConfigError(
                f"the ranks planned different starts ({key}: {listing}): every rank must read "
                "the same corpus (data.dir, by content) with the same settings, and the run "
                "folder from a file system all nodes share"
            )
    return start


def train_started(
    cfg: TrainJob,
    run: RunDir,
    start: Start,
    ranks: Ranks,
    policy: ExecutionPolicy,
    overrides: list[str],
) -> tuple[Path, str | None]:
    """Prepare (rank 0) or wait for the data, record the start, train, record the end; return
    the last checkpoint and the stop signal this rank received (None: none did)."""
    device = policy.device
    if ranks.is_main:
        if start.kind == StartKind.resume:  # newer step files: damaged ones it passed over,
            # or, from trainer.resume_from, the branch it abandons (a plain rerun would take it)
            abandoned = cfg.trainer.resume_from is not None
            run.checkpoints.keep_aside_newer_than(start.step, abandoned=abandoned)
        data = run.prepare(cfg.data)
        run.write_config(cfg)
        run.append_history(start_record(start, overrides, ranks, device))
        ranks.barrier()
    else:
        # Files polled, no collective yet: preparing may outlast the collectives' timeout.
        wait_until_prepared(cfg.data)
        data = prepare_corpora(cfg.data, build=False)  # waits for the other corpora and samples
        ranks.barrier()
    first_step, trainer = start.step, None
    try:
        torch.manual_seed(cfg.trainer.seed)  # the same initial parameters on every rank
        bleu = valid_bleu(cfg, data, policy)
        trainer = Trainer(cfg, run, data, policy, ranks, valid_bleu=bleu)
        if ranks.rank:
            torch.manual_seed(cfg.trainer.seed + ranks.rank)  # but other dropout masks
        log.info(
            "model: %s parameters (%s) on %s; %s",
            f"{count_parameters(trainer.model):,}",
            cfg.model.name,
            policy.describe(),
            trainer.plan.describe(),
        )
        trainer.begin(start)
        del start  # the checkpoint it held
        reason = fit_naming_out_of_memory(trainer)
    except BaseException as error:
        if ranks.is_main:
            step = trainer.progress.step if trainer is not None else first_step
            record_end(run, end_record("error", describe_error(error), step))
        raise
    if ranks.is_main:
        record = end_record(how_it_ended(trainer), reason, trainer.progress.step)
        run.append_history(record | best_record(trainer, policy))
    return run.checkpoints.last, trainer.stop_rules.signals.received


def fit_naming_out_of_memory(trainer: Trainer) -> str:
    """trainer.fit(), with CUDA out of memory turned into one line a user can act on. Nothing is
    lost: the run folder keeps its checkpoints, and the same command with a smaller
    trainer.batch_tokens (a steering key) resumes the last one with the same updates, planned in
    trainer.global_batch_tokens and cut into more micro-batches."""
    try:
        return trainer.fit()
    except torch.cuda.OutOfMemoryError as error:
        raise out_of_memory(trainer, str(error)) from error


def out_of_memory(trainer: Trainer, torch_said: str) -> OutOfMemory:
    """The line for CUDA out of memory: the micro-batch (its shape and padded tokens, the
    longer side's as trainer.batch_tokens counts them), the key to lower, the last checkpoint,
    and the first line of torch's message (how much it asked for, how much was free)."""
    settings, batch = trainer.cfg.trainer, trainer.micro_batch
    update = trainer.progress.step + 1
    if batch is None:
        where = (
            f"at update {update}, outside a training micro-batch (validation's loss batches hold "
            f"up to trainer.batch_tokens={settings.batch_tokens}; if it was validation BLEU, "
            "lower decode.batch_tokens instead)"
        )
    else:
        rows, source = batch.src.shape
        target = batch.tgt_in.shape[1]
        where = (
            f"in a micro-batch of update {update}: {rows} sentences x {source} source / {target} "
            f"target positions = {rows * max(source, target):,} padded tokens "
            f"(trainer.batch_tokens={settings.batch_tokens})"
        )
    saved = trainer.checkpointer.saved_step
    resumes = (
        f"resumes the last checkpoint, update {saved}"
        if saved >= 0
        else "starts afresh (no checkpoint was written yet)"
    )
    said = torch_said.strip().splitlines()[0] if torch_said.strip() else "no message"
    return OutOfMemory(
        f"CUDA out of memory {where}: run the same command with a smaller trainer.batch_tokens "
        f"(e.g. trainer.batch_tokens={settings.batch_tokens // 2}); it {resumes}, each update "
        f"still of trainer.global_batch_tokens={settings.global_batch_tokens} in more "
        f"micro-batches (torch: {said})"
    )


def valid_bleu(
    cfg: TrainJob, data: PreparedData, policy: ExecutionPolicy
) -> Callable[[Transformer], float] | None:
    """What validation BLEU is for this run: sacreBLEU of the model's translations of the first
    trainer.valid_bleu_sentences of the valid split as read, against the raw references (as
    tmt-eval scores the test split), searched with `validation_decode`'s settings on the
    training policy's device; None when it is off. A model trained into several target
    languages is scored on each language pair's valid split (`valid_sets`), each translated
    into its language; its BLEU is their mean, and each pair's is logged."""
    count = cfg.trainer.valid_bleu_sentences
    if not count:
        return None
    sets = valid_sets(cfg, data, count)
    decode = validation_decode(cfg, policy)
    several = bool(cfg.data.language_tags)
    languages = TargetLanguages.of(cfg.data, data.tokenizers.src) if several else None

    def score(model: Transformer) -> float:
        translator = Translator.for_model(
            model,
            data.tokenizers,
            decode,
            policy.device,
            unicode_form=cfg.data.unicode_form,
            languages=languages,
        )
        scores = {}
        for pair, (tgt_lang, sources, references) in sets.items():
            into = dataclasses.replace(decode, tgt_lang=tgt_lang) if several else decode
            hypotheses = translator.translate(sources, decode=into)
            scores[pair] = sacrebleu_scores(hypotheses, references).bleu
        if len(scores) > 1:
            log.info("valid BLEU by pair: %s", ", ".join(f"{p} {b:.2f}" for p, b in scores.items()))
        return sum(scores.values()) / len(scores)

    return score


def valid_sets(
    cfg: TrainJob, data: PreparedData, count: int
) -> dict[str, tuple[str, list[str], list[str]]]:
    """Each language pair's target language and first `count` valid sources and references:
    the main corpus's from its prepared folder; for a model trained into several languages,
    every other pair's as its corpus reads it (a pair whose corpus has no valid split is left
    out, with a warning)."""
    main = f"{cfg.data.src_lang}-{cfg.data.tgt_lang}"
    sets = {main: (cfg.data.tgt_lang, *data.valid_text(count))}
    if not cfg.data.language_tags:
        return sets
    for pair, pair_cfg in language_pairs(cfg.data).items():
        if pair in sets:
            continue
        try:
            sets[pair] = (pair_cfg.tgt_lang, *raw_pairs(pair_cfg, "valid", count))
        except DataError as error:
            log.warning("no valid BLEU for %s: its valid split cannot be read (%s)", pair, error)
    return sets


def validation_decode(cfg: TrainJob, policy: ExecutionPolicy) -> DecodeConfig:
    """The settings validation BLEU searches with: the decode group's, with
    trainer.valid_bleu_strategy, computing as the training step does (`validation_precision`)
    on the weights as trained (decode.quantize=none). So best.pt, and the score a sweep
    optimises, judge the model that training computes, not one that decode.precision=auto or
    bf16 would make depend on the machine (or a search in int8)."""
    return dataclasses.replace(
        cfg.decode,
        strategy=cfg.trainer.valid_bleu_strategy,
        precision=validation_precision(policy),
        quantize=CpuLinear.none,
    )


def validation_precision(policy: ExecutionPolicy) -> Precision:
    """What validation computes in: the training step's precision (its loss runs in the step's
    policy; its searches are told to), fp32 for an fp16 step, since a search takes fp32 or bf16
    only. The end record of the run's history says it (`best_record`)."""
    trained = Precision(policy.precision)
    return trained if trained in DECODE_PRECISIONS else Precision.fp32


@contextlib.contextmanager
def log_to_file(path: Path):
    """The package's log lines also into `path` (appended), formatted as on the console."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    package = logging.getLogger("transformer_mt")
    package.addHandler(handler)
    try:
        yield
    finally:
        package.removeHandler(handler)
        handler.close()


# ---- the run's history (history.jsonl) ----------------------------------------------------
def start_record(start: Start, overrides: list[str], ranks: Ranks, device: torch.device) -> dict:
    return {
        "event": "start",
        "time": now(),
        "kind": start.kind.value,
        "step": start.step,
        "from": str(start.path) if start.path else None,
        "parent": str(start.path) if start.kind == StartKind.fine_tune else None,
        "overrides": overrides,
        "changed": {d.key: d.as_record() for d in start.changed},
        "forced": [d.key for d in start.forced],
        "version": __version__,
        "git_commit": git_commit(),
        "host": socket.gethostname(),
        "world_size": ranks.world_size,
        "device": str(device),
    }


def record_end(run: RunDir, record: dict) -> None:
    """The end record of a run that failed, if the disk takes it: a full disk, the usual cause,
    must not bury the error that says which checkpoint is intact."""
    try:
        run.append_history(record)
    except OSError as error:
        log.warning("could not record the end in %s (%s)", run.path / run.HISTORY, error.strerror)


def how_it_ended(trainer: Trainer) -> str:
    """The end record's `how` of a run that ended without an error: stopped by a signal (the
    same command continues it), diverged (its best score is from before; a sweep counts it as
    a failed trial), or finished."""
    if trainer.stop_rules.signalled:
        return "stop signal"
    return "diverged" if trainer.stop_rules.diverged else "finished"


def end_record(how: str, reason: str, step: int) -> dict:
    return {"event": "end", "time": now(), "how": how, "reason": reason, "step": step}


def best_record(trainer: Trainer, policy: ExecutionPolicy) -> dict:
    """The run's best validation score, by which best.pt is chosen (what tmt-train returns to
    Hydra, so that a sweeper can optimise it): valid BLEU where it is computed, else minus the
    valid loss; None before any validation. With what the score was computed in: the search's
    precision (`validation_precision`), or the loss's (the training step's)."""
    best, validator = trainer.validator.progress, trainer.validator
    searched = validator.bleu is not None
    precision = validation_precision(policy).value if searched else policy.precision
    return {
        "best": {
            "score": best.best_score,
            "step": best.best_step,
            "metric": validator.metric,
            "precision": precision,
        }
    }


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def git_commit() -> str | None:
    """The commit of the code that runs, where it runs from a git checkout (an editable install);
    None otherwise."""
    source = Path(__file__).resolve().parents[2]
    if not (source / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None
