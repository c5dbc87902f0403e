"""tmt-export: a checkpoint of a run as a CTranslate2 model folder (the `export` extra)."""

from __future__ import annotations

from pathlib import Path

from transformer_mt.checkpoint import load_checkpoint, model_from_checkpoint
from transformer_mt.config import ExportJob
from transformer_mt.decode.ctranslate2_backend import export_model, import_ctranslate2
from transformer_mt.run_dir import RunDir


def export(job: ExportJob) -> Path:
    """Write the run's checkpoint as a CTranslate2 model folder; return the folder."""
    import_ctranslate2()  # fail before loading anything
    run = RunDir(job.run_dir)
    path = run.checkpoint(job.checkpoint)
    state = load_checkpoint(path)
    tokenizers = run.tokenizers()
    return export_model(
        model_from_checkpoint(state, path, tokenizers),
        tokenizers,
        run.checkpoint(job.output),
        unicode_form=run.data_config().unicode_form,
        quantization=job.quantization,
        provenance={"checkpoint": str(path), "step": int(state["step"])},
    )
