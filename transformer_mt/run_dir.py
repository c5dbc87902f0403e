"""The run folder: one training run's configuration, data pointer, tokenizers, checkpoints and
scores. Every command reads and writes it through `RunDir`, so its layout is written here once:

    run.lock               held by the one training command that may write the folder
    config.yaml            the composed configuration of tmt-train's latest start (eval reads the
                           data settings; a resume is compared with it)
    history.jsonl          one line per start and per end of tmt-train
    prepared.json          {"folder": the prepared corpus this run trains on}
    spm.model | spm.src.model + spm.tgt.model    copies of the tokenizer(s)
    checkpoints/           the checkpoints (checkpoint/folder.py names them), exported models
    tensorboard/           training and validation scalars
    train.log              the log of tmt-train (rank 0's): a line every trainer.log_every
    hypotheses.SPLIT.txt, scores.SPLIT.json      what tmt-eval translated and measured
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from transformer_mt.checkpoint.folder import CheckpointFolder
from transformer_mt.config import DataConfig
from transformer_mt.data.corpora import prepare_corpora
from transformer_mt.data.prepare import PreparedData, prepared_folder
from transformer_mt.data.tokenizer import TOKENIZER_FILES, Tokenizers, load_tokenizers
from transformer_mt.errors import ConfigError, DataError
from transformer_mt.files import copy_atomically, remove_partial_writes, write_text_atomically
from transformer_mt.run_lock import RunLock


class RunDir:
    CONFIG = "config.yaml"
    PREPARED = "prepared.json"
    HISTORY = "history.jsonl"
    LOG = "train.log"
    LOCK = "run.lock"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    @property
    def checkpoints(self) -> CheckpointFolder:
        return CheckpointFolder(self.path / "checkpoints")

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def old_compile_cache(self) -> Path:
        """Where versions before issue 59 kept torch.compile's cache: never read (a compile cache
        is code; train/compile_cache.py keeps it in the user's own cache folder)."""
        return self.path / "compile-cache"

    def checkpoint(self, name: str) -> Path:
        """A checkpoint (or exported model) name inside checkpoints/, or a path as given."""
        candidate = Path(name)
        if candidate.is_absolute() or candidate.parent != Path("."):
            return candidate
        return self.checkpoints.path / name

    def written_by_training(self, name: str) -> bool:
        """Whether tmt-train writes the file `name` of the folder's top level."""
        return name in (self.CONFIG, self.PREPARED, *TOKENIZER_FILES)

    def remove_partial_training_writes(self) -> list[Path]:
        """Delete what an interrupted write of tmt-train left (checkpoints and the folder's own
        files); only tmt-train's: tmt-eval or tmt-average may be writing the rest now."""
        stale = self.checkpoints.remove_partial_writes()
        if self.path.is_dir():
            stale += remove_partial_writes(self.path, self.written_by_training)
        return stale

    def lock(self) -> RunLock:
        """The exclusive lock of a command that writes the folder (RunFolderInUse if held)."""
        return RunLock(self.path / self.LOCK)

    # ---- configuration and history -----------------------------------------------------------
    def write_config(self, job) -> None:
        """Record the composed configuration (a TrainJob) as config.yaml."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_text_atomically(self.path / self.CONFIG, OmegaConf.to_yaml(OmegaConf.structured(job)))

    def saved_config(self) -> dict | None:
        """config.yaml as plain values, or None before the run's first start."""
        config = self.load_config()
        return None if config is None else OmegaConf.to_container(config)

    def load_config(self):
        """config.yaml as OmegaConf read it, None if there is none; ConfigError if unreadable."""
        config_path = self.path / self.CONFIG
        if not config_path.is_file():
            return None
        try:
            config = OmegaConf.load(config_path)
        except Exception as error:  # yaml's errors, a decoding error, a folder of that name
            raise ConfigError(self.unreadable_config(f"not valid YAML ({error})")) from None
        if not isinstance(config, DictConfig) or "data" not in config:
            raise ConfigError(self.unreadable_config("it has no data settings"))
        return config

    def unreadable_config(self, why: str) -> str:
        return (
            f"{self.path / self.CONFIG} is unreadable: {why}; restore it from a backup, or "
            "delete it and run tmt-train with the run's settings, which writes it anew (the "
            "checkpoint still checks the data and the model shape)"
        )

    def append_history(self, record: dict) -> None:
        """One JSON line appended to history.jsonl (flushed to disk: it is the run's record), in
        one write; a write cut short (a full disk) is undone, so no line is ever torn."""
        self.path.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        handle = os.open(self.path / self.HISTORY, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.lseek(handle, 0, os.SEEK_END)
            try:
                if os.write(handle, line) != len(line):
                    raise OSError(errno.ENOSPC, "short write")
                os.fsync(handle)
            except OSError:
                with contextlib.suppress(OSError):  # the write's error is the one to report
                    os.ftruncate(handle, start)
                raise
        finally:
            os.close(handle)

    def history(self) -> list[dict]:
        """The records of history.jsonl (a line that does not parse, e.g. from an older
        version's write cut short by a full disk, is skipped)."""
        path = self.path / self.HISTORY
        if not path.is_file():
            return []
        records = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
        return records

    def data_config(self) -> DataConfig:
        """The data configuration the run was trained with."""
        saved = self.load_config()
        if saved is None:
            raise ConfigError(
                f"{self.path / self.CONFIG} not found: is '{self.path}' a run folder written by "
                "tmt-train?"
            )
        try:
            merged = OmegaConf.merge(OmegaConf.structured(DataConfig), saved.data)
            return OmegaConf.to_object(merged)
        except Exception as error:  # omegaconf's validation errors name the key
            raise ConfigError(self.unreadable_config(f"its data settings: {error}")) from None

    # ---- data and tokenizers -----------------------------------------------------------------
    def prepare(self, cfg: DataConfig) -> PreparedData:
        """The run's prepared corpus, built if needed; refused before any work when the run was
        started on other data."""
        self.check_prepared(prepared_folder(cfg))
        data = prepare_corpora(cfg)
        self.adopt_prepared(data.folder, data.tokenizers)
        return data

    def check_prepared(self, folder: Path, differences=()) -> None:
        """DataError unless the run is new or was started on the prepared corpus `folder`: a
        run folder keeps the data (and tokenizer) it was started with. `differences`: the data
        settings that changed since the run's start, for the message."""
        record = self.path / self.PREPARED
        if not record.is_file():
            return
        try:
            previous = Path(json.loads(record.read_text())["folder"]).name
        except (ValueError, KeyError, TypeError):
            raise DataError(
                f"{record} is not readable: delete it, and rerun to record the prepared data"
            ) from None
        if previous != folder.name:
            because = (
                "".join(f"\n  {difference}" for difference in differences) + "\n"
                if differences
                else " (the corpus, or a data or tokenizer setting, changed): "
            )
            raise DataError(
                f"{self.path} was prepared as {previous}, but this configuration prepares "
                f"{folder.name}{because}use a new run_dir, restore the original settings, or "
                f"fine-tune from this run on the new data with trainer.init_from={self.path}"
            )

    def adopt_prepared(self, folder: Path, tokenizers: Tokenizers) -> None:
        """Record the prepared corpus and copy its tokenizer(s), so the folder alone translates."""
        self.check_prepared(folder)
        self.path.mkdir(parents=True, exist_ok=True)
        for name in set(TOKENIZER_FILES) - {path.name for path in tokenizers.files}:
            (self.path / name).unlink(missing_ok=True)  # a stale model would shadow the new one
        for path in tokenizers.files:
            copy_atomically(path, self.path / path.name)
        record = {"folder": str(folder.resolve())}
        write_text_atomically(self.path / self.PREPARED, json.dumps(record, indent=2) + "\n")

    def tokenizers(self) -> Tokenizers:
        return load_tokenizers(self.path)

    def has_tokenizer(self) -> bool:
        return any((self.path / name).is_file() for name in TOKENIZER_FILES)

    # ---- evaluation --------------------------------------------------------------------------
    def hypotheses_file(self, split: str) -> Path:
        return self.path / f"hypotheses.{split}.txt"

    def scores_file(self, split: str) -> Path:
        return self.path / f"scores.{split}.json"

    def write_evaluation(self, split: str, hypotheses: list[str], scores: dict) -> None:
        write_text_atomically(self.hypotheses_file(split), "".join(h + "\n" for h in hypotheses))
        write_text_atomically(self.scores_file(split), json.dumps(scores, indent=2) + "\n")
