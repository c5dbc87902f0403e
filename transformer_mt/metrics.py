"""Translation metrics on detokenized text: sacreBLEU's BLEU and chrF with their signatures, and a
tokenized BLEU that approximates the paper's, reported apart. A leaf: nothing of ours below it."""

from __future__ import annotations

import re
from dataclasses import dataclass

import sacrebleu
from sacrebleu.metrics.bleu import BLEUScore
from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International

INTL_TOKENIZER = TokenizerV14International()
COMPOUND = re.compile(r"(\S)-(\S)")
TOKENIZED_BLEU_NOTE = (
    "tokenized BLEU, an approximation of the paper's metric, not sacreBLEU's default BLEU: text "
    "tokenized with sacreBLEU's 'intl' tokenizer (the paper's get_ende_bleu.sh uses the Moses "
    "tokenizer, which splits some punctuation and apostrophes differently), hyphenated "
    "compounds split as a ##AT##-##AT## b as that script does, then scored without further "
    "tokenization or smoothing, like multi-bleu.perl"
)


@dataclass(frozen=True)
class SacreBleuScores:
    """Corpus BLEU and chrF as sacreBLEU computes them by default, with their signatures."""

    bleu: float
    bleu_signature: str
    bleu_detail: str
    chrf: float
    chrf_signature: str


@dataclass(frozen=True)
class TokenizedBleu:
    """The approximation of the paper's BLEU, under names that say so, with its recipe."""

    bleu_tokenized: float
    bleu_tokenized_signature: str
    bleu_tokenized_detail: str
    bleu_tokenized_note: str = TOKENIZED_BLEU_NOTE


def sacrebleu_scores(hypotheses: list[str], references: list[str]) -> SacreBleuScores:
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return SacreBleuScores(
        bleu=round(bleu_score.score, 2),
        bleu_signature=str(bleu.get_signature()),
        bleu_detail=str(bleu_score),
        chrf=round(chrf_score.score, 2),
        chrf_signature=str(chrf.get_signature()),
    )


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


def tokenized_bleu_scores(hypotheses: list[str], references: list[str]) -> TokenizedBleu:
    score, signature = tokenized_bleu(hypotheses, references)
    return TokenizedBleu(
        bleu_tokenized=round(score.score, 2),
        bleu_tokenized_signature=signature,
        bleu_tokenized_detail=str(score),
    )
