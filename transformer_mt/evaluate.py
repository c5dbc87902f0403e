"""Translate a split of a run's corpus; score it with sacreBLEU (BLEU, chrF, signatures)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import sacrebleu
from omegaconf import OmegaConf

from transformer_mt.config import EvalJob, run_data_config, validate_decode
from transformer_mt.data.sources import read_pairs
from transformer_mt.decode.translator import Translator

log = logging.getLogger(__name__)


def sacrebleu_scores(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU and chrF on detokenized text, as sacreBLEU computes them by default."""
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(bleu_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "bleu_detail": str(bleu_score),
        "chrf": round(chrf_score.score, 2),
        "chrf_signature": str(chrf.get_signature()),
    }


def evaluate(cfg: EvalJob) -> dict:
    """Translate the split; write hypotheses and scores into the run folder; return the scores."""
    validate_decode(cfg.decode)
    run_dir = Path(cfg.run_dir)
    data_cfg = run_data_config(run_dir)
    translator = Translator.from_run(run_dir, cfg.checkpoint, decode=cfg.decode, device=cfg.device)
    pairs = list(read_pairs(data_cfg, cfg.split))
    sources, references = [src for src, _ in pairs], [tgt for _, tgt in pairs]
    started = time.perf_counter()
    hypotheses = translator.translate(sources)
    seconds = time.perf_counter() - started
    scores = sacrebleu_scores(hypotheses, references)
    scores.update(
        split=cfg.split,
        sentences=len(sources),
        checkpoint=cfg.checkpoint,
        decode=OmegaConf.to_container(OmegaConf.structured(cfg.decode), enum_to_str=True),
        decode_seconds=round(seconds, 2),
    )
    (run_dir / f"hypotheses.{cfg.split}.txt").write_text(
        "".join(h + "\n" for h in hypotheses), encoding="utf-8"
    )
    (run_dir / f"scores.{cfg.split}.json").write_text(
        json.dumps(scores, indent=2) + "\n", encoding="utf-8"
    )
    return scores
