"""tmt-export: a checkpoint of a run as a CTranslate2 model folder (the `export` extra) or as a
transformers MarianMTModel folder with its model card (the `hf` extra)."""

from __future__ import annotations

import json
from pathlib import Path

from transformer_mt.config import ExportFormat, ExportJob, config_dict
from transformer_mt.data.sources import corpus_identity
from transformer_mt.decode.ctranslate2_backend import import_ctranslate2
from transformer_mt.decode.loading import (
    EXPORT_INFO,
    EXPORTED,
    LoadedCheckpoint,
    load_run_checkpoint,
)
from transformer_mt.export import ctranslate2 as ctranslate2_export
from transformer_mt.export import transformers as transformers_export
from transformer_mt.files import check_replaceable, check_writable
from transformer_mt.run_dir import RunDir


def export(job: ExportJob) -> Path:
    """Write the run's checkpoint in job.format; return the folder."""
    job.validate()
    if job.format == ExportFormat.transformers:
        transformers_export.import_transformers()  # fail before loading anything
    else:
        import_ctranslate2()
    run = RunDir(job.run_dir)
    output = run.checkpoint(job.output)
    check_replaceable(output, marker=EXPORT_INFO, what=EXPORTED)  # before any work
    check_writable(output, "config key 'output'")
    loaded = load_run_checkpoint(run, job.checkpoint, weights=job.weights)
    if job.format == ExportFormat.transformers:
        card = model_card(run, loaded)
        return transformers_export.export_model(loaded.model, loaded.tokenizers, output, card=card)
    return ctranslate2_export.export_model(
        loaded.model,
        loaded.tokenizers,
        output,
        unicode_form=loaded.data.unicode_form,
        quantization=job.quantization,
        provenance={
            "checkpoint": str(loaded.path),
            "step": loaded.step,
            "weights": "moving average" if loaded.moving_average else "as trained",
            # what a translation into each language puts first (decode.tgt_lang)
            "tgt_lang": loaded.data.tgt_lang,
            "language_tags": loaded.data.language_tags,
        },
    )


def model_card(run: RunDir, loaded: LoadedCheckpoint) -> transformers_export.ModelCard:
    """What the run folder says about the checkpoint it loaded."""
    scores, progress = run.scores_file("test"), loaded.record.progress
    return transformers_export.ModelCard(
        checkpoint=str(loaded.path),
        step=loaded.step,
        train_seconds=None if progress is None else progress.counts.train_seconds,
        corpus=corpus_identity(loaded.data),
        data=config_dict(loaded.data),
        test_scores=json.loads(scores.read_text(encoding="utf-8")) if scores.is_file() else None,
    )
