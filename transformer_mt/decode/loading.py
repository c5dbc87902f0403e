"""Loading what translates, from the run folder alone: a checkpoint (our model, the run's
tokenizers and its data.unicode_form) or a folder that tmt-export wrote (run by CTranslate2).
tmt-translate, tmt-eval and tmt-serve load their Translator here, tmt-export its checkpoint.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_mt.checkpoint import CheckpointRecord, load_checkpoint, model_from_checkpoint
from transformer_mt.checkpoint.folder import LAST
from transformer_mt.config import DataConfig, DecodeConfig
from transformer_mt.data.tokenizer import Tokenizers, load_tokenizers
from transformer_mt.decode.ctranslate2_backend import CTranslate2Search, import_ctranslate2
from transformer_mt.decode.translator import Translator
from transformer_mt.device import resolve_device
from transformer_mt.errors import CheckpointError, ConfigError
from transformer_mt.model import Transformer
from transformer_mt.run_dir import RunDir

log = logging.getLogger(__name__)
EXPORT_INFO = "transformer_mt.json"
"""Written by tmt-export into every folder it writes (beside CTranslate2's files: what translating
needs besides the model): the mark of a folder that a new export may replace."""
EXPORTED = "a model folder written by tmt-export"


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A run's checkpoint with what runs it: the model built from it and the run's tokenizers
    and data settings."""

    path: Path
    record: CheckpointRecord  # what the checkpoint says of itself (update, progress, ...)
    model: Transformer
    tokenizers: Tokenizers
    data: DataConfig  # the run's (config.yaml): data.unicode_form, and the export's model card

    @property
    def step(self) -> int:
        return self.record.step


def load_run_checkpoint(run: RunDir, checkpoint: str) -> LoadedCheckpoint:
    """The checkpoint `checkpoint` of the run (a name in checkpoints/, or a path), loaded."""
    path = run.checkpoint(checkpoint)
    state = load_checkpoint(path)
    tokenizers = run.tokenizers()
    model = model_from_checkpoint(state, path, tokenizers)
    record = CheckpointRecord.read(state, path)
    return LoadedCheckpoint(path, record, model, tokenizers, run.data_config())


def load_translator(
    run_dir: str | Path,
    checkpoint: str = LAST,
    *,
    decode: DecodeConfig | None = None,
    device: str = "auto",
) -> Translator:
    """A Translator whose default decode settings are `decode` (None: DecodeConfig's). A
    `checkpoint` that names a folder written by tmt-export is run by CTranslate2."""
    run = RunDir(run_dir)
    decode = decode or DecodeConfig()
    if run.checkpoint(checkpoint).is_dir():
        return translator_from_export(run.checkpoint(checkpoint), decode=decode, device=device)
    loaded = load_run_checkpoint(run, checkpoint)
    log.info("translating with %s (update %d)", loaded.path, loaded.step)
    return Translator.for_model(
        loaded.model,
        loaded.tokenizers,
        decode,
        resolve_device(device),
        unicode_form=loaded.data.unicode_form,
        origin={"checkpoint": str(loaded.path.resolve()), "step": loaded.step},
    )


def translator_from_export(
    folder: str | Path,
    *,
    decode: DecodeConfig | None = None,
    device: str = "auto",
    compute_type: str = "default",
    threads: int = 0,
) -> Translator:
    """A Translator over the model folder tmt-export wrote. compute_type: CTranslate2's (default:
    the type the weights were stored in; int8, float32, ...). threads: CPU threads (0: as many as
    torch uses)."""
    ctranslate2 = import_ctranslate2()
    folder = Path(folder)
    if (folder / "generation_config.json").is_file():
        raise CheckpointError(
            f"{folder}: a transformers model (tmt-export format=transformers): load it with "
            "transformers' MarianMTModel (its README.md shows how); tmt-translate and "
            "tmt-eval run checkpoints and CTranslate2 exports"
        )
    if not (folder / EXPORT_INFO).is_file():
        raise CheckpointError(f"{folder}: not a folder written by tmt-export (no {EXPORT_INFO})")
    info = json.loads((folder / EXPORT_INFO).read_text(encoding="utf-8"))
    target = resolve_device(device)
    try:
        engine = ctranslate2.Translator(
            str(folder),
            device=target.type,
            device_index=target.index or 0,
            compute_type=compute_type,
            intra_threads=threads or torch.get_num_threads(),
        )
    except (RuntimeError, ValueError) as error:  # e.g. its CUDA build's libraries are missing
        raise ConfigError(
            f"{folder}: CTranslate2 {ctranslate2.__version__} cannot run it on {target} "
            f"({error}); device=cpu runs it on the CPU"
        ) from error
    tokenizers = load_tokenizers(folder)
    log.info("translating with the CTranslate2 model %s (update %s)", folder, info.get("step"))
    backend = CTranslate2Search(engine, tokenizers, max_positions=int(info["max_positions"]))
    return Translator(
        backend,
        tokenizers,
        decode or DecodeConfig(),
        unicode_form=info["unicode_form"],
        origin={"checkpoint": str(folder.resolve()), "format": "ctranslate2"},
    )
