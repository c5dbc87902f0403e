"""tmt-export: a checkpoint of a run as a CTranslate2 model folder (the `export` extra) or as a
transformers MarianMTModel folder with its model card (the `hf` extra)."""

from __future__ import annotations

import json
from pathlib import Path

from transformer_mt.checkpoint import config_dict, load_checkpoint, model_from_checkpoint
from transformer_mt.config import ExportFormat, ExportJob
from transformer_mt.data.sources import corpus_identity
from transformer_mt.decode import ctranslate2_backend, transformers_export
from transformer_mt.decode.ctranslate2_backend import EXPORT_INFO, EXPORTED
from transformer_mt.errors import ConfigError
from transformer_mt.files import check_replaceable
from transformer_mt.run_dir import RunDir


def export(job: ExportJob) -> Path:
    """Write the run's checkpoint in job.format; return the folder."""
    if job.format == ExportFormat.transformers:
        if job.quantization is not None:
            raise ConfigError(
                f"config key 'quantization': {job.quantization} is for format=ctranslate2; "
                "format=transformers writes float32 (null)"
            )
        transformers_export.import_transformers()  # fail before loading anything
    else:
        ctranslate2_backend.import_ctranslate2()
    run = RunDir(job.run_dir)
    output = run.checkpoint(job.output)
    check_replaceable(output, marker=EXPORT_INFO, what=EXPORTED)  # before any work
    path = run.checkpoint(job.checkpoint)
    state = load_checkpoint(path)
    tokenizers = run.tokenizers()
    model = model_from_checkpoint(state, path, tokenizers)
    if job.format == ExportFormat.transformers:
        card = model_card(run, path, state)
        return transformers_export.export_model(model, tokenizers, output, card=card)
    return ctranslate2_backend.export_model(
        model,
        tokenizers,
        output,
        unicode_form=run.data_config().unicode_form,
        quantization=job.quantization,
        provenance={"checkpoint": str(path), "step": int(state["step"])},
    )


def model_card(run: RunDir, path: Path, state: dict) -> transformers_export.ModelCard:
    """What the run folder says about the checkpoint at `path` (loaded as `state`)."""
    scores = run.scores_file("test")
    data = run.data_config()
    return transformers_export.ModelCard(
        checkpoint=str(path),
        step=int(state["step"]),
        train_seconds=state.get("progress", {}).get("train_seconds"),
        corpus=corpus_identity(data),
        data=config_dict(data),
        test_scores=json.loads(scores.read_text(encoding="utf-8")) if scores.is_file() else None,
    )
