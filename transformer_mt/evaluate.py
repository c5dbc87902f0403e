"""Translate a split of a run's corpus; score it with sacreBLEU (BLEU, chrF, signatures) and with
a tokenized BLEU that approximates the paper's, reported separately."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import sacrebleu
from omegaconf import OmegaConf
from sacrebleu.metrics.bleu import BLEUScore
from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International

from transformer_mt.config import EvalJob, run_data_config, validate_decode
from transformer_mt.data.sources import read_pairs
from transformer_mt.decode.translator import Translator

log = logging.getLogger(__name__)

INTL_TOKENIZER = TokenizerV14International()
COMPOUND = re.compile(r"(\S)-(\S)")
TOKENIZED_BLEU_NOTE = (
    "tokenized BLEU, an approximation of the paper's metric, not sacreBLEU's default BLEU: text "
    "tokenized with sacreBLEU's 'intl' tokenizer (the paper's get_ende_bleu.sh uses the Moses "
    "tokenizer, which splits some punctuation and apostrophes differently), hyphenated "
    "compounds split as a ##AT##-##AT## b as that script does, then scored without further "
    "tokenization or smoothing, like multi-bleu.perl"
)


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


def split_compounds(line: str) -> str:
    """The paper's en-de script: perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'."""
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def paper_tokenize(line: str) -> str:
    """International tokenization (mteval-v14), then compound splitting, in the script's order:
    tokenize first, split compounds second. ('intl' separates hyphens between letters itself and
    would break ##AT## apart if it came second; hyphens between digits are left to the split.)"""
    return split_compounds(INTL_TOKENIZER(line))


def tokenized_bleu(hypotheses: list[str], references: list[str]) -> tuple[BLEUScore, str]:
    """Corpus BLEU of paper-tokenized text, as multi-bleu.perl computes it (no smoothing), and
    its signature: sacreBLEU's (tok:none, as it saw pre-tokenized text) behind the recipe."""
    bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    score = bleu.corpus_score(
        [paper_tokenize(h) for h in hypotheses], [[paper_tokenize(r) for r in references]]
    )
    return score, f"pre:intl+compound-split|{bleu.get_signature()}"


def tokenized_bleu_scores(hypotheses: list[str], references: list[str]) -> dict:
    """The approximation of the paper's BLEU under keys that say so, with its recipe and a note."""
    score, signature = tokenized_bleu(hypotheses, references)
    return {
        "bleu_tokenized": round(score.score, 2),
        "bleu_tokenized_signature": signature,
        "bleu_tokenized_detail": str(score),
        "bleu_tokenized_note": TOKENIZED_BLEU_NOTE,
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
    scores.update(tokenized_bleu_scores(hypotheses, references))
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
