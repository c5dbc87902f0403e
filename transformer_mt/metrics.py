"""Translation metrics on detokenized text: sacreBLEU's BLEU and chrF with their signatures, and the
paper's tokenized BLEU (the Moses tokenizer, compounds split), reported apart. A leaf: nothing of
ours below it.

sacremoses is imported where the tokenized BLEU first needs it, not with this module: training,
evaluation and the benchmarks import this module for sacreBLEU alone, and a machine without
sacremoses (the lent GPU machine's image has none) must still run them."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sacrebleu
from sacrebleu.metrics.bleu import BLEUScore

if TYPE_CHECKING:
    from sacremoses import MosesTokenizer

COMPOUND = re.compile(r"(\S)-(\S)")
TOKENIZED_BLEU_NOTE = (
    "tokenized BLEU by the recipe of the paper's get_ende_bleu.sh, not sacreBLEU's BLEU: the Moses "
    "tokenizer (tokenizer.perl -l {lang}, through its port sacremoses: special characters "
    "escaped, hyphens kept), hyphenated compounds split as a ##AT##-##AT## b, then scored "
    "without further tokenization or smoothing, like multi-bleu.perl (the paper scored against "
    "a reference file tokenized beforehand, newstest2014.tok.de; here the references go through "
    "the hypotheses' steps)"
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
    """The paper's tokenized BLEU, under names that say so, with its recipe."""

    bleu_tokenized: float
    bleu_tokenized_signature: str
    bleu_tokenized_detail: str
    bleu_tokenized_note: str = TOKENIZED_BLEU_NOTE.format(lang="de")


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


@functools.lru_cache(maxsize=4)
def moses_tokenizer(lang: str) -> MosesTokenizer:
    """One per language: building one reads that language's non-breaking prefixes."""
    from sacremoses import MosesTokenizer  # here, not at the top: the module's docstring

    return MosesTokenizer(lang=lang)


def paper_tokenize(line: str, lang: str = "de") -> str:
    """get_ende_bleu.sh's steps, in its order: `tokenizer.perl -l de` (the target language),
    then compound splitting. tokenizer.perl's defaults are kept: special characters escaped
    (& < > ' " [ ] | as &amp; &lt; &gt; &apos; &quot; &#91; &#93; &#124;, as the paper's
    references are) and no aggressive hyphen splitting (-a), which would turn "well-known" into
    "well @-@ known", and the compound split then into "well @ ##AT##-##AT## @ known": the
    script's own split is the one that separates hyphens."""
    tokens = moses_tokenizer(lang).tokenize(
        line, aggressive_dash_splits=False, return_str=True, escape=True
    )
    return split_compounds(tokens)


def tokenized_bleu(
    hypotheses: list[str], references: list[str], lang: str = "de"
) -> tuple[BLEUScore, str]:
    """Corpus BLEU of paper-tokenized text, as multi-bleu.perl computes it (no smoothing), and
    its signature: sacreBLEU's (tok:none, as it saw pre-tokenized text) behind the recipe."""
    bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    score = bleu.corpus_score(
        [paper_tokenize(h, lang) for h in hypotheses],
        [[paper_tokenize(r, lang) for r in references]],
    )
    return score, f"pre:moses-{lang}+escape+compound-split|{bleu.get_signature()}"


def tokenized_bleu_scores(
    hypotheses: list[str], references: list[str], lang: str = "de"
) -> TokenizedBleu:
    """The paper's tokenized BLEU; `lang`: the target language, whose rules the Moses tokenizer
    applies (the paper's en-de script: de)."""
    score, signature = tokenized_bleu(hypotheses, references, lang)
    return TokenizedBleu(
        bleu_tokenized=round(score.score, 2),
        bleu_tokenized_signature=signature,
        bleu_tokenized_detail=str(score),
        bleu_tokenized_note=TOKENIZED_BLEU_NOTE.format(lang=lang),
    )
