"""train/start.plan_start's decision table, one row per rule, over a hand-written run folder:
config.yaml (RunDir.write_config of a composed tiny job), prepared.json and checkpoints written
with save_checkpoint (the keys of Trainer.state_dict, with empty weights: plan_start never loads
them). No training, no data preparation: plan_start takes the prepared folder as a path. The
rows assert outcomes (the start's kind, update, checkpoint, changed and forced keys; or the
error's type and a message naming the key and both values), not how plan_start decides."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from transformer_mt.checkpoint import save_checkpoint
from transformer_mt.config import TrainJob, config_dict
from transformer_mt.data.tokenizer import SHARED_FILE, train_tokenizer
from transformer_mt.data.toy import toy_pairs
from transformer_mt.errors import CheckpointError, ConfigError, DataError
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.run_dir import RunDir
from transformer_mt.train.start import (
    PRECISION_COMPUTED,
    StartKind,
    plan_start,
    use_parent_tokenizer,
)

PREPARED = "toy-aaaa"  # the prepared folder's name this configuration would build
OTHER_DATA = "toy-bbbb"


def with_settings(job: TrainJob, *settings: str) -> TrainJob:
    """The job with these `key=value` settings, checked by its schema as on the command line
    (a merge, not a Hydra composition, which costs a tenth of a second each)."""
    merged = OmegaConf.merge(OmegaConf.structured(job), OmegaConf.from_dotlist(list(settings)))
    return OmegaConf.to_object(merged)


class Folders:
    """The test's folders: the run (run/), a parent to fine-tune from (parent/), prepared/."""

    def __init__(self, root: Path, tiny_job: TrainJob):
        self.root = root
        self.run = RunDir(root / "run")
        self.jobs = {(): tiny_job}

    def job(self, *settings: str) -> TrainJob:
        """The tiny job with these settings."""
        if settings not in self.jobs:
            self.jobs[settings] = with_settings(self.jobs[()], *settings)
        return self.jobs[settings]

    def started_with(self, *overrides: str) -> None:
        """config.yaml as the run's previous start wrote it, with these settings."""
        self.run.write_config(self.job(*overrides))

    def prepared_as(self, name: str) -> None:
        record = {"folder": str(self.root / "prepared" / name)}
        (self.run.path / RunDir.PREPARED).write_text(json.dumps(record))

    def checkpoint(self, relative: str, step: int, *overrides: str, **entries) -> Path:
        """A training checkpoint of the job with these settings, at `relative` to the root;
        `entries` replace the saved state's values."""
        path = self.root / relative
        save_checkpoint(training_state(self.job(*overrides), step) | entries, path)
        return path


def training_state(job: TrainJob, step: int) -> dict:
    """What Trainer.state_dict saves, for a model of the job's shape trained on PREPARED."""
    progress = {"step": step, "epoch": 1, "batch_in_epoch": 0, "batches_in_epoch": 10}
    return {
        "model": {},
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": {"last_epoch": step},
        "scaler": {},
        "model_config": config_dict(job.model),
        "vocab_size": job.data.vocab_size,
        "src_vocab_size": None,
        "data_folder": PREPARED,
        "step": step,
        "progress": progress,
        "rng_cpu": [],
        "rng_cuda": [],
        "rng_mps": [],
    }


@dataclass(frozen=True)
class Started:
    kind: StartKind
    step: int = 0
    path: str | None = None  # relative to the test's root
    changed: list[str] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Refused:
    error: type[Exception]
    fragments: tuple[str, ...]  # each in the message


# ---- the run folders, one per row ------------------------------------------------------------
def empty(folders: Folders) -> None:
    pass


def empty_checkpoints_folder(folders: Folders) -> None:
    (folders.root / "run/checkpoints").mkdir(parents=True)


def settings_without_checkpoint(folders: Folders) -> None:
    folders.started_with("optim.label_smoothing=0.2")


def trained_200(folders: Folders) -> None:
    folders.started_with()
    folders.prepared_as(PREPARED)
    folders.checkpoint("run/checkpoints/step_100.pt", 100)
    folders.checkpoint("run/checkpoints/step_200.pt", 200)
    folders.checkpoint("run/checkpoints/last.pt", 200)


def trained_by_an_older_version(folders: Folders) -> None:
    """config.yaml without trainer.global_batch_padded, as versions before it wrote it."""
    trained_200(folders)
    path = folders.run.path / RunDir.CONFIG
    saved = OmegaConf.to_container(OmegaConf.load(path))
    del saved["trainer"]["global_batch_padded"]
    path.write_text(OmegaConf.to_yaml(saved))


def trained_with(*overrides: str) -> Callable[[Folders], None]:
    def build(folders: Folders) -> None:
        folders.started_with(*overrides)
        folders.checkpoint("run/checkpoints/step_200.pt", 200, *overrides)

    return build


def trained_in_bf16(folders: Folders) -> None:
    """A run started with trainer.precision=auto whose checkpoint says it trained in bf16 (auto on
    a GPU); here, on the CPU, auto trains in fp32."""
    folders.started_with("trainer.precision=auto")
    folders.prepared_as(PREPARED)
    folders.checkpoint("run/checkpoints/step_200.pt", 200, precision="bf16")


def prepared_on_other_data(folders: Folders) -> None:
    folders.started_with("data.vocab_size=300")
    folders.prepared_as(OTHER_DATA)


def prepared_on_other_corpus(folders: Folders) -> None:
    folders.started_with()
    folders.prepared_as(OTHER_DATA)


def unreadable_prepared_record(folders: Folders) -> None:
    folders.started_with()
    (folders.run.path / RunDir.PREPARED).write_text("{not json")


def unreadable_config(folders: Folders) -> None:
    folders.run.path.mkdir(parents=True)
    (folders.run.path / RunDir.CONFIG).write_text("data: [unclosed\n")


def checkpoint_on_other_data(folders: Folders) -> None:
    folders.started_with()
    folders.checkpoint("run/checkpoints/step_200.pt", 200, data_folder=OTHER_DATA)


def parent_tokenizer(folders: Folders) -> None:
    """The parent run's SentencePiece model, of the job's vocabulary size (fine-tuning encodes
    with it: use_parent_tokenizer)."""
    sentences = [s for pair in toy_pairs(400, seed=3) for s in pair]
    size = folders.job().data.vocab_size
    (folders.root / "parent").mkdir(parents=True, exist_ok=True)
    train_tokenizer(sentences, folders.root / "parent" / SHARED_FILE, vocab_size=size)


def parent_run(folders: Folders) -> None:
    parent_tokenizer(folders)
    folders.checkpoint("parent/checkpoints/step_300.pt", 300)
    folders.checkpoint("parent/checkpoints/last.pt", 300)


def parent_of_another_shape(folders: Folders) -> None:
    parent_tokenizer(folders)
    folders.checkpoint("parent/checkpoints/last.pt", 300, "model.d_model=128", "model.d_ff=256")


def parent_of_another_vocabulary(folders: Folders) -> None:
    parent_tokenizer(folders)
    folders.checkpoint("parent/checkpoints/last.pt", 300, vocab_size=500)


def trained_and_averaged(folders: Folders) -> None:
    trained_200(folders)
    average = {
        "model": {},
        **{
            k: v
            for k, v in training_state(folders.job(), 200).items()
            if k not in ("optimizer", "scheduler", "scaler", "progress")
        },
    }
    save_checkpoint(average, folders.root / "run/checkpoints/averaged.pt")


def parent_without_last(folders: Folders) -> None:
    parent_tokenizer(folders)
    folders.checkpoint("parent/checkpoints/step_300.pt", 300)


def parent_and_own_checkpoints(folders: Folders) -> None:
    parent_run(folders)
    trained_200(folders)


def newest_unreadable(folders: Folders) -> None:
    trained_200(folders)
    (folders.root / "run/checkpoints/step_300.pt").write_bytes(b"cut short")


def none_readable(folders: Folders) -> None:
    folders.started_with()
    checkpoints = folders.root / "run/checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "step_200.pt").write_bytes(b"cut short")
    (checkpoints / "last.pt").write_bytes(b"")


def only_last(folders: Folders) -> None:
    folders.started_with()
    folders.checkpoint("run/checkpoints/last.pt", 200)


# ---- the table ---------------------------------------------------------------------------------
STEP_200 = "run/checkpoints/step_200.pt"
ROWS = [
    pytest.param(empty, [], Started(StartKind.new), id="new run: an empty folder"),
    pytest.param(
        empty_checkpoints_folder,
        [],
        Started(StartKind.new),
        id="new run: a checkpoints folder with no checkpoint",
    ),
    pytest.param(
        settings_without_checkpoint,
        [],
        Started(StartKind.new, changed=["optim.label_smoothing"]),
        id="new run: settings changed since a start that left no checkpoint are only listed",
    ),
    pytest.param(
        trained_200,
        [],
        Started(StartKind.resume, 200, STEP_200),
        id="resume (auto): the newest step checkpoint, same settings",
    ),
    pytest.param(
        only_last,
        [],
        Started(StartKind.resume, 200, "run/checkpoints/last.pt"),
        id="resume (auto): last.pt when there is no step file",
    ),
    pytest.param(
        trained_200,
        ["trainer.max_steps=400", "decode.beam_size=2"],
        Started(StartKind.resume, 200, STEP_200, changed=["decode.beam_size", "trainer.max_steps"]),
        id="resume: a steering change (trainer.max_steps, decode.*) is listed, not forced",
    ),
    pytest.param(
        trained_200,
        ["optim.label_smoothing=0.2"],
        Refused(ConfigError, ("optim.label_smoothing: 0.1 → 0.2", "trainer.resume=force")),
        id="refused: a training change without trainer.resume=force",
    ),
    pytest.param(
        trained_200,
        ["optim.label_smoothing=0.2", "model.dropout=0.3", "trainer.resume=force"],
        Started(
            StartKind.resume,
            200,
            STEP_200,
            changed=["model.dropout", "optim.label_smoothing", "trainer.resume"],
            forced=["model.dropout", "optim.label_smoothing"],
        ),
        id="resume: training changes with trainer.resume=force are forced",
    ),
    pytest.param(
        trained_in_bf16,
        ["trainer.precision=auto"],
        Refused(
            ConfigError,
            (
                'trainer.precision (what the updates computed in): "bf16" → "fp32"',
                "trainer.precision=bf16 to go on in what it trained in",
                "trainer.resume=force",
            ),
        ),
        id="refused: the precision auto gives here is not what the checkpoint trained in",
    ),
    pytest.param(
        trained_in_bf16,
        ["trainer.precision=auto", "trainer.resume=force"],
        Started(
            StartKind.resume,
            200,
            STEP_200,
            changed=["trainer.resume"],
            forced=[PRECISION_COMPUTED],
        ),
        id="resume: another precision with trainer.resume=force is forced",
    ),
    pytest.param(
        trained_in_bf16,
        ["trainer.precision=bf16"],
        Started(StartKind.resume, 200, STEP_200, changed=["trainer.precision"]),
        id="resume: trainer.precision=bf16 goes on in the bf16 that auto trained in",
    ),
    pytest.param(
        trained_in_bf16,
        ["trainer.precision=fp32"],
        Refused(ConfigError, ('"bf16" → "fp32"', "trainer.precision=bf16 to go on")),
        id="refused: trainer.precision=fp32 on a run that trained in bf16",
    ),
    pytest.param(
        trained_200,
        ["trainer.resume=never"],
        Refused(ConfigError, ("trainer.resume=never", "3 checkpoint file(s)", "resume=auto")),
        id="refused: trainer.resume=never over existing checkpoints",
    ),
    pytest.param(
        empty_checkpoints_folder,
        ["trainer.resume=never"],
        Started(StartKind.new),
        id="new run: trainer.resume=never over a checkpoints folder with none",
    ),
    pytest.param(
        prepared_on_other_data,
        [],
        Refused(
            DataError,
            (f"was prepared as {OTHER_DATA}", f"prepares {PREPARED}", "data.vocab_size: 300 → 400"),
        ),
        id="refused: prepared.json names other data (the changed data setting named)",
    ),
    pytest.param(
        prepared_on_other_corpus,
        [],
        Refused(DataError, (f"was prepared as {OTHER_DATA}", f"prepares {PREPARED}", "corpus")),
        id="refused: prepared.json names other data (no setting changed: the corpus did)",
    ),
    pytest.param(
        unreadable_prepared_record,
        [],
        Refused(DataError, (RunDir.PREPARED, "not readable")),
        id="refused: an unreadable prepared.json",
    ),
    pytest.param(
        unreadable_config,
        [],
        Refused(ConfigError, (RunDir.CONFIG, "unreadable")),
        id="refused: an unreadable config.yaml",
    ),
    pytest.param(
        checkpoint_on_other_data,
        [],
        Refused(
            CheckpointError, (f"trained on prepared data {OTHER_DATA}", f"prepares {PREPARED}")
        ),
        id="refused: the checkpoint's data_folder is other data",
    ),
    pytest.param(
        trained_with("model.d_model=128", "model.d_ff=256"),
        ["trainer.resume=force"],
        Refused(CheckpointError, ("model.d_model is 64", "but 128 in the checkpoint")),
        id="refused: another model shape, even with trainer.resume=force",
    ),
    pytest.param(
        trained_200,
        ["trainer.resume_from={root}/run/checkpoints/step_100.pt"],
        Started(
            StartKind.resume, 100, "run/checkpoints/step_100.pt", changed=["trainer.resume_from"]
        ),
        id="resume: trainer.resume_from=PATH over the run's newer checkpoints",
    ),
    pytest.param(
        empty,
        ["trainer.resume_from={root}/nowhere/step_100.pt"],
        Refused(CheckpointError, ("nowhere/step_100.pt", "not found")),
        id="refused: trainer.resume_from names no file",
    ),
    pytest.param(
        parent_run,
        ["trainer.init_from={root}/parent"],
        Started(StartKind.fine_tune, 0, "parent/checkpoints/last.pt"),
        id="fine-tune: trainer.init_from a run folder (its last.pt)",
    ),
    pytest.param(
        parent_run,
        ["trainer.init_from={root}/parent/checkpoints/step_300.pt"],
        Started(StartKind.fine_tune, 0, "parent/checkpoints/step_300.pt"),
        id="fine-tune: trainer.init_from a checkpoint file",
    ),
    pytest.param(
        trained_by_an_older_version,
        [],
        Started(StartKind.resume, 200, STEP_200),
        id="resume: a setting the saved config.yaml lacks counts as its default",
    ),
    pytest.param(
        trained_by_an_older_version,
        ["trainer.global_batch_padded=true"],
        Refused(ConfigError, ("trainer.global_batch_padded: false → true",)),
        id="refused: a new setting changed from its default",
    ),
    pytest.param(
        parent_of_another_shape,
        ["trainer.init_from={root}/parent"],
        Refused(CheckpointError, ("model.d_model is 64", "but 128 in the checkpoint")),
        id="refused: fine-tuning from a parent of another model shape, before any write",
    ),
    pytest.param(
        parent_of_another_vocabulary,
        ["trainer.init_from={root}/parent"],
        Refused(CheckpointError, ("embedding has 500 target pieces", "has 400", "spm_model")),
        id="refused: fine-tuning from a parent whose embedding is not its tokenizer's size",
    ),
    pytest.param(
        trained_and_averaged,
        ["trainer.resume_from={root}/run/checkpoints/averaged.pt"],
        Refused(CheckpointError, ("averaged.pt", "no optimizer state", "trainer.init_from")),
        id="refused: trainer.resume_from a checkpoint without optimizer state (an average)",
    ),
    pytest.param(
        parent_without_last,
        ["trainer.init_from={root}/parent"],
        Refused(CheckpointError, ("parent/checkpoints/last.pt", "not found")),
        id="refused: trainer.init_from a run folder without last.pt",
    ),
    pytest.param(
        parent_and_own_checkpoints,
        ["trainer.init_from={root}/parent"],
        Started(StartKind.resume, 200, STEP_200, changed=["trainer.init_from"]),
        id="resume: trainer.init_from on a run that has checkpoints resumes the run",
    ),
    pytest.param(
        newest_unreadable,
        [],
        Started(StartKind.resume, 200, STEP_200),
        id="resume: an unreadable newest checkpoint falls back to the previous one",
    ),
    pytest.param(
        none_readable,
        [],
        Refused(CheckpointError, ("no readable checkpoint", "step_200.pt", "last.pt")),
        id="refused: checkpoints of which none is readable",
    ),
]


def planned_in(cfg) -> str:
    """What the row's command would compute in: the execution policy's precision on the CPU."""
    return ExecutionPolicy.for_training(cfg.trainer, torch.device("cpu")).precision


@pytest.mark.parametrize(("folder", "overrides", "expected"), ROWS)
def test_plan_start(folder, overrides, expected, tiny_train_job, tmp_path):
    folders = Folders(tmp_path, tiny_train_job())
    folder(folders)
    cfg = folders.job(*(override.format(root=tmp_path) for override in overrides))
    if not folders.run.checkpoints.checkpoint_files():
        # A first start with trainer.init_from: commands/train.py makes the parent's tokenizer
        # data.spm_model before planning (use_parent_tokenizer), and fine-tuning checks it.
        use_parent_tokenizer(cfg)
    prepared = tmp_path / "prepared" / PREPARED
    if isinstance(expected, Refused):
        with pytest.raises(expected.error) as refusal:
            plan_start(cfg, folders.run, prepared, planned_in(cfg))
        for fragment in expected.fragments:
            assert fragment in str(refusal.value)
        return
    start = plan_start(cfg, folders.run, prepared, planned_in(cfg))
    assert start.kind == expected.kind
    assert start.step == expected.step
    assert start.path == (None if expected.path is None else tmp_path / expected.path)
    assert sorted(d.key for d in start.changed) == expected.changed
    assert sorted(d.key for d in start.forced) == expected.forced
