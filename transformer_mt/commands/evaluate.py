"""tmt-eval: translate a split of the run's corpus and score it (sacreBLEU's BLEU and chrF, and a
tokenized BLEU of the paper's recipe, reported apart). With decode.length_penalty=auto, alpha is
chosen first by BLEU on the valid split (commands/valid_choice.py) and recorded with the scores."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from transformer_mt.commands.valid_choice import (
    LENGTH_PENALTY_BEYOND,
    LENGTH_PENALTY_GRID,
    ValidChoice,
    choose_on_valid,
    valid_prefix,
)
from transformer_mt.config import AUTO, DataConfig, DecodeConfig, EvalJob
from transformer_mt.data.corpora import language_pairs
from transformer_mt.data.sources import corpus_identity, read_pairs
from transformer_mt.decode.loading import load_translator
from transformer_mt.decode.translator import Translator
from transformer_mt.files import check_writable
from transformer_mt.metrics import (
    SacreBleuScores,
    TokenizedBleu,
    sacrebleu_scores,
    tokenized_bleu_scores,
)
from transformer_mt.run_dir import RunDir


@dataclass(frozen=True)
class EvalReport:
    split: str
    sentences: int
    checkpoint: dict  # path, and the update it was written at
    data: str  # the corpus the split was read from
    decode: dict  # the decode settings used, as the search ran them (precision: what it
    # computed in, 'fp32 (auto)')
    decode_seconds: float
    sacrebleu: SacreBleuScores
    tokenized: TokenizedBleu
    length_penalty_auto: ValidChoice | None = (
        None  # decode.length_penalty=auto: how alpha was chosen
    )
    language_pair: str | None = None  # "de-en", of a model trained into several languages
    unmet_terms: int = 0  # decode.glossary: lines translated without their terms (none met them)
    hypotheses: list[str] = dataclasses.field(default_factory=list, repr=False)

    def to_json(self) -> dict:
        """The flat record written as scores.SPLIT.json."""
        record = {**dataclasses.asdict(self.sacrebleu), **dataclasses.asdict(self.tokenized)}
        fields = ("split", "sentences", "checkpoint", "data", "decode", "decode_seconds")
        record.update({name: getattr(self, name) for name in fields})
        if self.language_pair is not None:
            record["language_pair"] = self.language_pair
        if self.decode.get("glossary") is not None:
            record["unmet_terms"] = self.unmet_terms
        if self.length_penalty_auto is not None:
            record["length_penalty_auto"] = self.length_penalty_auto.to_json()
        return record

    @property
    def heading(self) -> str:
        return self.split if self.language_pair is None else f"{self.split} {self.language_pair}"

    def format(self) -> str:
        bleu, tokenized = self.sacrebleu, self.tokenized
        lines = []
        if (chosen := self.length_penalty_auto) is not None:
            lines.append(
                f"length penalty {chosen.chosen} (auto: the best valid BLEU, "
                f"{chosen.valid_bleu[str(chosen.chosen)]:.2f}, of the {len(chosen.grid)} tried "
                f"on {chosen.valid_sentences} valid sentences)"
            )
        if self.decode.get("glossary") is not None:
            lines.append(
                f"glossary {self.decode['glossary']}: {self.unmet_terms} of {self.sentences} "
                "sentences translated without their terms (none of their hypotheses met them "
                "within the length limit)"
            )
        return "\n".join(
            lines
            + [
                f"{self.heading}: BLEU {bleu.bleu:.2f}  chrF {bleu.chrf:.2f}  ({self.sentences} "
                f"sentences, decoded in {self.decode_seconds:.1f} s)",
                f"  {bleu.bleu_detail}",
                f"  sacreBLEU signature: {bleu.bleu_signature}",
                f"  chrF signature: {bleu.chrf_signature}",
                f"tokenized BLEU {tokenized.bleu_tokenized:.2f} (the paper's recipe: Moses "
                "tokenizer, compounds split, multi-bleu; not sacreBLEU)",
                f"  {tokenized.bleu_tokenized_detail}",
                f"  signature: {tokenized.bleu_tokenized_signature}",
                f"  {tokenized.bleu_tokenized_note}",
            ]
        )


def evaluate(job: EvalJob) -> EvalReport:
    """Translate the split; write hypotheses and scores into the run folder; return the report
    (of a model trained into several languages: the main corpus's pair's; `evaluate_pairs` has
    every pair's)."""
    return evaluate_pairs(job)[0]


def evaluate_pairs(job: EvalJob) -> list[EvalReport]:
    """`evaluate`, for every language pair of the run: one report of its one pair, or, for a
    model trained into several target languages, one per pair of its corpora
    (data/corpora.language_pairs), each translated into its target language (decode.tgt_lang)
    and written as hypotheses.SPLIT.PAIR.txt and scores.SPLIT.PAIR.json."""
    job.validate()
    auto = job.decode.length_penalty == AUTO
    # auto: the translator's own alpha is never used; each call below names the one it tries.
    decode = dataclasses.replace(job.decode, length_penalty=0.0) if auto else job.decode
    run = RunDir(job.run_dir)
    data_cfg = run.data_config()
    several = bool(data_cfg.language_tags)
    pairs = language_pairs(data_cfg) if several else {None: data_cfg}
    names = {pair: job.split if pair is None else f"{job.split}.{pair}" for pair in pairs}
    for name in names.values():
        for written in (run.hypotheses_file(name), run.scores_file(name)):
            check_writable(written, "tmt-eval")  # before the decoding
    translator = load_translator(
        run.path, job.checkpoint, decode=decode, device=job.device, weights=job.weights
    )
    reports = []
    for pair, pair_cfg in pairs.items():
        into = dataclasses.replace(decode, tgt_lang=pair_cfg.tgt_lang) if several else decode
        report = evaluate_pair(job, translator, into, pair_cfg, pair, auto=auto)
        run.write_evaluation(names[pair], report.hypotheses, report.to_json())
        reports.append(report)
    return reports


def evaluate_pair(
    job: EvalJob,
    translator: Translator,
    decode: DecodeConfig,
    data_cfg: DataConfig,
    pair: str | None,
    *,
    auto: bool,
) -> EvalReport:
    """The report of one language pair's split (pair None: the run's one pair)."""
    choice = None
    if auto:
        choice = choose_length_penalty(
            translator, decode, *valid_prefix(data_cfg, job.valid_sentences, "valid_sentences")
        )
        decode = dataclasses.replace(decode, length_penalty=choice.chosen)
    read = list(read_pairs(data_cfg, job.split))
    sources, references = [src for src, _ in read], [tgt for _, tgt in read]
    started = time.perf_counter()
    best = [nbest[0] for nbest in translator.translate_nbest(sources, decode=decode)]
    seconds = time.perf_counter() - started
    hypotheses = [translation.text for translation in best]
    return EvalReport(
        split=job.split,
        sentences=len(sources),
        checkpoint=translator.origin,
        data=corpus_identity(data_cfg),
        decode=translator.settings_record(decode),
        decode_seconds=round(seconds, 2),
        sacrebleu=sacrebleu_scores(hypotheses, references),
        tokenized=tokenized_bleu_scores(hypotheses, references, lang=data_cfg.tgt_lang),
        length_penalty_auto=choice,
        language_pair=pair,
        unmet_terms=sum(translation.unmet_terms for translation in best),
        hypotheses=hypotheses,
    )


def choose_length_penalty(
    translator: Translator, decode: DecodeConfig, sources: list[str], references: list[str]
) -> ValidChoice:
    """decode.length_penalty=auto: the alpha of LENGTH_PENALTY_GRID (then LENGTH_PENALTY_BEYOND
    while the largest tried wins) whose translations of the valid `sources` have the best BLEU,
    with `decode`'s other settings."""

    def translate(alpha: float) -> list[str]:
        return translator.translate(
            sources, decode=dataclasses.replace(decode, length_penalty=alpha)
        )

    return choose_on_valid(
        "decode.length_penalty", LENGTH_PENALTY_GRID, translate, references, LENGTH_PENALTY_BEYOND
    )


def pairs_summary(reports: list[EvalReport]) -> str:
    """One line per language pair (a model trained into several), after the reports."""
    return "\n".join(
        f"{r.heading}: BLEU {r.sacrebleu.bleu:.2f}  chrF {r.sacrebleu.chrf:.2f}" for r in reports
    )
