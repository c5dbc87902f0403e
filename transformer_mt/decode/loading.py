"""Loading what translates, from the run folder alone: a checkpoint (our model, the run's
tokenizers and its data.unicode_form) or a folder that tmt-export wrote (run by CTranslate2).
tmt-translate, tmt-eval and tmt-serve load their Translator here, tmt-export its checkpoint.
Several checkpoints translate as an ensemble (decode/search.py's `Ensemble`), when every one
comes with the same tokenizer files.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_mt.checkpoint import CheckpointRecord, load_checkpoint, model_from_checkpoint
from transformer_mt.checkpoint.folder import LAST
from transformer_mt.checkpoint.training_state import has_moving_average
from transformer_mt.config import CpuLinear, DataConfig, DecodeConfig, Weights
from transformer_mt.data.tags import TargetLanguages
from transformer_mt.data.tokenizer import Tokenizers, load_tokenizers
from transformer_mt.decode.ctranslate2_backend import CTranslate2Search, import_ctranslate2
from transformer_mt.decode.search import Ensemble
from transformer_mt.decode.translator import Translator
from transformer_mt.device import prepare_process, resolve_device
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
    moving_average: bool = False  # the model holds the moving average of the run's weights

    @property
    def step(self) -> int:
        return self.record.step

    def describe(self) -> str:
        """'runs/x/checkpoints/last.pt (update 800, the moving average of its weights)'."""
        average = ", the moving average of its weights" if self.moving_average else ""
        return f"{self.path} (update {self.step}{average})"


def load_run_checkpoint(
    run: RunDir,
    checkpoint: str,
    home: Tokenizers | None = None,
    weights: Weights = Weights.auto,
) -> LoadedCheckpoint:
    """The checkpoint `checkpoint` of the run (a name in checkpoints/, or a path), loaded and
    checked against the run's tokenizers (home: those of another run folder it lies in,
    model_from_checkpoint says why), with its `weights` (the moving average, for auto, where
    the run kept one)."""
    path = run.checkpoint(checkpoint)
    state = load_checkpoint(path)
    tokenizers = run.tokenizers()
    model = model_from_checkpoint(state, path, tokenizers, home, weights)
    record = CheckpointRecord.read(state, path)
    averaged = weights != Weights.raw and has_moving_average(state)
    return LoadedCheckpoint(path, record, model, tokenizers, run.data_config(), averaged)


def load_translator(
    run_dir: str | Path,
    checkpoint: str | list[str] = LAST,
    *,
    decode: DecodeConfig | None = None,
    device: str = "auto",
    keep_freed_memory: bool = True,
    weights: Weights = Weights.auto,
) -> Translator:
    """A Translator whose default decode settings are `decode` (None: DecodeConfig's), with each
    checkpoint's `weights` (auto: the moving average where the run kept one). A
    `checkpoint` that names a folder written by tmt-export is run by CTranslate2. A list of
    checkpoints translates as their Ensemble (one: that checkpoint alone); a checkpoint inside
    another run's checkpoints/ must come with the same tokenizer files as run_dir's. origin:
    the checkpoint's path and update (an ensemble: lists of them, in the order given).

    keep_freed_memory: on the CPU, also make the process's malloc keep the memory it frees
    (device.keep_freed_host_memory, as tmt-train does), what the commands use. Each decoding step
    allocates logits of rows x vocabulary floats (38 MB for 1,200 rows and 8,000 pieces), which
    glibc would otherwise map afresh, page by page, at every step (make bench-decode: "ours int8"
    against "ours int8, glibc's default malloc")."""
    run = RunDir(run_dir)
    decode = decode or DecodeConfig()
    names = checkpoint_names(checkpoint)
    if len(names) == 1 and run.checkpoint(names[0]).is_dir():
        folder = run.checkpoint(names[0])
        return translator_from_export(
            folder, decode=decode, device=device, keep_freed_memory=keep_freed_memory
        )
    members = [load_member(run, name, weights) for name in names]
    for member in members:
        log.info("translating with %s", member.describe())
    paths, steps = [str(m.path.resolve()) for m in members], [m.step for m in members]
    one = len(members) == 1
    target = resolve_device(device)
    prepare_process(target, keep_freed_memory=keep_freed_memory)  # as tmt-train's
    return Translator.for_model(
        Ensemble([m.model for m in members]),
        members[0].tokenizers,
        decode,
        target,
        unicode_form=members[0].data.unicode_form,
        origin={"checkpoint": paths[0] if one else paths, "step": steps[0] if one else steps},
        languages=TargetLanguages.of(members[0].data, members[0].tokenizers.src),
    )


def checkpoint_names(checkpoint: str | list[str]) -> list[str]:
    """The `checkpoint` setting as a list of names or paths (one or several)."""
    names = [checkpoint] if isinstance(checkpoint, str) else list(checkpoint)
    if not names or not all(isinstance(name, str) and name for name in names):
        raise ConfigError(
            f"config key 'checkpoint': {checkpoint!r} is not a checkpoint or a list of them "
            "(checkpoint=last.pt, checkpoint=[a.pt,b.pt])"
        )
    return names


def load_member(run: RunDir, name: str, weights: Weights = Weights.auto) -> LoadedCheckpoint:
    """Checkpoint `name`, with run's tokenizers; refused (one line naming both files) if it lies
    in another run folder whose tokenizer files differ from run's (an export cannot join an
    ensemble)."""
    path = run.checkpoint(name)
    if path.is_dir():
        raise ConfigError(
            f"config key 'checkpoint': {path} is {EXPORTED}; an ensemble takes checkpoints only"
        )
    home = RunDir(path.parent.parent)
    foreign = home.path.resolve() != run.path.resolve()
    if foreign and path.parent.name == "checkpoints" and home.has_tokenizer():
        return load_run_checkpoint(run, name, home=home.tokenizers(), weights=weights)
    return load_run_checkpoint(run, name, weights=weights)


def translator_from_export(
    folder: str | Path,
    *,
    decode: DecodeConfig | None = None,
    device: str = "auto",
    compute_type: str = "default",
    threads: int = 0,
    keep_freed_memory: bool = True,
) -> Translator:
    """A Translator over the model folder tmt-export wrote. compute_type: CTranslate2's (default:
    the type the weights were stored in; int8, float32, ...). threads: CPU threads (0: as many as
    torch uses). keep_freed_memory: as load_translator's."""
    decode = decode or DecodeConfig()
    if decode.quantize != CpuLinear.none:
        raise ConfigError(
            f"config key 'decode.quantize': {decode.quantize.value} is for transformer_mt "
            "checkpoints; a CTranslate2 export computes in int8 when tmt-export wrote it with "
            "quantization=int8"
        )
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
    prepare_process(target, keep_freed_memory=keep_freed_memory)  # as tmt-train's
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
        decode,
        unicode_form=info["unicode_form"],
        origin={"checkpoint": str(folder.resolve()), "format": "ctranslate2"},
        languages=exported_languages(info, tokenizers),
    )


def exported_languages(info: dict, tokenizers: Tokenizers) -> TargetLanguages | None:
    """What an export translates into, as tmt-export recorded it (None: an export from before
    it did, which says nothing: decode.tgt_lang is not checked)."""
    if "tgt_lang" not in info:
        return None
    processor = tokenizers.src.processor
    tags = {lang: processor.piece_to_id(tag) for lang, tag in info["language_tags"].items()}
    return TargetLanguages(info["tgt_lang"], tags)
