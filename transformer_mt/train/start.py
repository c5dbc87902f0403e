"""How a training command starts in its run folder: as a new run, by resuming the run's
checkpoint, or by fine-tuning a parent model. Decided, and refused when it must be, before
anything is written: a refused command leaves the run folder as it was.

Resuming compares the configuration with the one the run folder recorded at its previous start.
Settings that only steer the remaining work may change (STEERING_KEYS, decode.*); a change to
what is being trained (optimizer, schedule, label smoothing, dropout, seed, global batch,
precision, ...) is refused unless trainer.resume=force; a change of model shape or of the data
and tokenizer cannot continue the run at all.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from transformer_mt.checkpoint import (
    Checkpoint,
    CheckpointRecord,
    Purpose,
    check_fits,
    load_checkpoint,
)
from transformer_mt.config import ResumeMode, TrainJob, config_dict, plain_value
from transformer_mt.data.prepare import load_given_tokenizers
from transformer_mt.data.tokenizer import load_tokenizers
from transformer_mt.errors import ConfigError
from transformer_mt.run_dir import RunDir

log = logging.getLogger(__name__)

# Settings that steer the remaining work, not what is being trained: free to change on resume.
STEERING_KEYS = frozenset(
    {
        "trainer.max_steps",
        "trainer.max_epochs",
        "trainer.max_time_minutes",
        "trainer.checkpoint_every",
        "trainer.checkpoint_every_minutes",
        "trainer.checkpoint_min_seconds",
        "trainer.valid_every",
        "trainer.valid_bleu_sentences",
        "trainer.valid_bleu_strategy",
        "trainer.keep_checkpoints",
        "trainer.patience",
        "trainer.log_every",
        "trainer.batch_tokens",
        "trainer.loader_workers",
        "trainer.num_threads",
        "trainer.progress_bar",
        "trainer.rank_timeout_minutes",
        "trainer.agree_every",
        "trainer.max_nonfinite_updates",
        "trainer.device",
        "trainer.compile",
        "trainer.sdpa_backends",  # which kernels compute attention, not what is trained
        "trainer.cpu_linear",  # which kernel multiplies on the CPU, likewise
        "trainer.source_lengths",  # which sentences share a micro-batch, as batch_tokens
        "trainer.resume",
        "trainer.resume_from",
        "trainer.init_from",  # used by a run's first start only
        "run_dir",
        "model.name",
        "data.name",
        "data.test_split",
        "data.prepared_dir",
        "data.num_workers",
    }
)
STEERING_PREFIXES = ("decode.",)
PRECISION_COMPUTED = "trainer.precision (what the updates computed in)"
"""The Difference a resume reports where the precision the run trained in, recorded in its
checkpoint, is not what this command's trainer.precision gives on its device."""


class StartKind(str, Enum):
    new = "new"
    resume = "resume"
    fine_tune = "fine-tune"


@dataclass(frozen=True)
class Difference:
    key: str
    saved: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key}: {shown(self.saved)} → {shown(self.new)}"

    @property
    def steering(self) -> bool:
        return self.key in STEERING_KEYS or self.key.startswith(STEERING_PREFIXES)

    def as_record(self) -> list:
        return [self.saved, self.new]


@dataclass
class Start:
    kind: StartKind
    checkpoint: Checkpoint | None = None  # the checkpoint resumed, or the parent's
    changed: list[Difference] = field(default_factory=list)  # since the previous start
    forced: list[Difference] = field(default_factory=list)  # accepted with trainer.resume=force

    @property
    def path(self) -> Path | None:
        return None if self.checkpoint is None else self.checkpoint.path

    @property
    def step(self) -> int:
        return self.checkpoint.record.step if self.kind == StartKind.resume else 0


def shown(value: Any) -> str:
    return "(absent)" if value is None else json.dumps(value, ensure_ascii=False)


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_differences(
    saved: dict, new: dict, default: Callable[[str], Any] = lambda key: None
) -> list[Difference]:
    """Every setting whose value differs, by dotted key. A key the saved configuration lacks (a
    setting added since it was written) counts as default(key), one the new lacks as null."""
    old, current = flatten(saved), flatten(new)

    def before(key: str) -> Any:
        return old[key] if key in old else default(key)

    return [
        Difference(key, before(key), current.get(key))
        for key in sorted(old.keys() | current.keys())
        if before(key) != current.get(key)
    ]


def schema_default(job: TrainJob, key: str) -> Any:
    """The default of the dotted `key` in the job's schema (None where it has none): what a
    configuration written before the setting existed meant."""
    *parents, name = key.split(".")
    node = job
    for part in parents:
        node = getattr(node, part, None)
    if node is None or not dataclasses.is_dataclass(node):
        return None
    for field_ in dataclasses.fields(node):
        if field_.name == name:
            if field_.default is not dataclasses.MISSING:
                return plain_value(field_.default)
            if field_.default_factory is not dataclasses.MISSING:
                return plain_value(field_.default_factory())
    return None


def use_parent_tokenizer(cfg: TrainJob) -> None:
    """trainer.init_from: encode the new data with the parent's SentencePiece model(s) (a new
    tokenizer would scramble the embeddings), unless data.spm_model names one."""
    if cfg.trainer.init_from is None:
        return
    init_from = Path(cfg.trainer.init_from)
    if not init_from.exists():
        raise ConfigError(f"trainer.init_from={init_from}: no such run folder or checkpoint")
    if cfg.data.spm_model is not None:
        return
    folder = parent_run_folder(init_from)
    cfg.data.spm_model = str(folder.resolve())
    cfg.data.shared_vocab = load_tokenizers(folder).shared


def parent_run_folder(init_from: Path) -> Path:
    """The run folder that holds the parent's tokenizer: init_from itself, or the run folder of
    a checkpoint inside its checkpoints/."""
    candidates = [init_from] if init_from.is_dir() else [init_from.parent.parent, init_from.parent]
    for folder in candidates:
        if RunDir(folder).has_tokenizer():
            return folder
    raise ConfigError(
        f"trainer.init_from={init_from}: no SentencePiece model beside it (a run folder, or a "
        "checkpoint in one); name the parent's tokenizer with data.spm_model=PATH"
    )


def parent_checkpoint(init_from: Path) -> Path:
    if init_from.is_dir():
        return RunDir(init_from).checkpoints.last
    return init_from


def plan_start(cfg: TrainJob, run: RunDir, data_folder: Path, precision: str) -> Start:
    """How this command starts; CheckpointError / ConfigError / DataError when it must not. Reads,
    never writes: every check of the checkpoint is made here, before anything is written.
    precision: what this command would compute in (the execution policy's), which a resume
    compares with what the checkpoint was trained in."""
    saved = run.saved_config()
    changed = []
    if saved is not None:
        changed = config_differences(saved, config_dict(cfg), lambda key: schema_default(cfg, key))
    run.check_prepared(data_folder, [d for d in changed if d.key.startswith("data.")])
    found = resumable_checkpoint(cfg, run)
    if found is not None:
        ours = CheckpointRecord.of_run(cfg.model, None, data_folder.name)
        check_fits(Purpose.resume, ours, found.record, found.path)
        found.training_state()  # an average has none: refused here, by name
        training = [d for d in changed if not d.steering]
        trained_in = found.record.precision
        if trained_in is not None:
            # What the updates compute in is compared, not the setting that chose it: auto and
            # bf16 train alike where auto is bf16, and auto trains otherwise on another machine.
            training = [d for d in training if d.key != "trainer.precision"]
            if trained_in != precision:
                training.append(Difference(PRECISION_COMPUTED, trained_in, precision))
        if training and cfg.trainer.resume != ResumeMode.force:
            keep = (
                f"trainer.precision={trained_in} to go on in what it trained in, "
                if trained_in not in (None, precision)
                else ""
            )
            raise ConfigError(
                f"{run} was started with other settings, which change what is being trained:\n"
                + "".join(f"  {d}\n" for d in training)
                + f"Use a new run_dir, {keep}or "
                "trainer.resume=force to continue this run with the new settings (recorded in "
                "history.jsonl)"
            )
        if cfg.trainer.init_from is not None:
            log.info("trainer.init_from serves a run's first start only: %s resumes", run)
        return Start(StartKind.resume, found, changed, training)
    if cfg.trainer.init_from is not None:
        path = parent_checkpoint(Path(cfg.trainer.init_from))
        parent = Checkpoint.of(load_checkpoint(path), path)
        # use_parent_tokenizer made data.spm_model the parent's tokenizer, unless one was given.
        ours = CheckpointRecord.of_run(cfg.model, load_given_tokenizers(cfg.data))
        spm_model = f"this run's tokenizer (data.spm_model={cfg.data.spm_model})"
        check_fits(Purpose.fine_tune, ours, parent.record, path, ours_from=spm_model)
        return Start(StartKind.fine_tune, parent, changed)
    return Start(StartKind.new, changed=changed)


def resumable_checkpoint(cfg: TrainJob, run: RunDir) -> Checkpoint | None:
    """The checkpoint to continue from: trainer.resume_from, else the run's newest readable one;
    ConfigError when trainer.resume=never finds some."""
    if cfg.trainer.resume_from is not None:
        path = Path(cfg.trainer.resume_from)
        return Checkpoint.of(load_checkpoint(path), path)
    folder = run.checkpoints
    if cfg.trainer.resume == ResumeMode.never:
        existing = folder.checkpoint_files()
        if existing:
            raise ConfigError(
                f"trainer.resume=never, but {folder} holds {len(existing)} checkpoint file(s): "
                "use a new run_dir, or trainer.resume=auto to continue"
            )
        return None
    found = folder.newest_readable()
    return None if found is None else Checkpoint.of(*found)


def describe(start: Start) -> str:
    if start.kind == StartKind.resume:
        return f"resumed from {start.path} at update {start.step}"
    if start.kind == StartKind.fine_tune:
        return f"fine-tuning from {start.path} (update {start.checkpoint.record.step} of its run)"
    return "a new run"
