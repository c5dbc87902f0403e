"""tmt-eval: translate a split of the run's corpus and score it (sacreBLEU's BLEU and chrF, and a
tokenized BLEU of the paper's recipe, reported apart)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from transformer_mt.config import EvalJob, config_dict, validate_decode
from transformer_mt.data.sources import corpus_identity, read_pairs
from transformer_mt.decode.loading import load_translator
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
    decode: dict  # the decode settings used, as plain values
    decode_seconds: float
    sacrebleu: SacreBleuScores
    tokenized: TokenizedBleu

    def to_json(self) -> dict:
        """The flat record written as scores.SPLIT.json."""
        record = {**dataclasses.asdict(self.sacrebleu), **dataclasses.asdict(self.tokenized)}
        fields = ("split", "sentences", "checkpoint", "data", "decode", "decode_seconds")
        record.update({name: getattr(self, name) for name in fields})
        return record

    def format(self) -> str:
        bleu, tokenized = self.sacrebleu, self.tokenized
        return "\n".join(
            [
                f"{self.split}: BLEU {bleu.bleu:.2f}  chrF {bleu.chrf:.2f}  ({self.sentences} "
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
    """Translate the split; write hypotheses and scores into the run folder; return the report."""
    validate_decode(job.decode)
    run = RunDir(job.run_dir)
    data_cfg = run.data_config()
    translator = load_translator(run.path, job.checkpoint, decode=job.decode, device=job.device)
    pairs = list(read_pairs(data_cfg, job.split))
    sources, references = [src for src, _ in pairs], [tgt for _, tgt in pairs]
    started = time.perf_counter()
    hypotheses = translator.translate(sources)
    seconds = time.perf_counter() - started
    report = EvalReport(
        split=job.split,
        sentences=len(sources),
        checkpoint=translator.origin,
        data=corpus_identity(data_cfg),
        decode=config_dict(job.decode),
        decode_seconds=round(seconds, 2),
        sacrebleu=sacrebleu_scores(hypotheses, references),
        tokenized=tokenized_bleu_scores(hypotheses, references, lang=data_cfg.tgt_lang),
    )
    run.write_evaluation(job.split, hypotheses, report.to_json())
    return report
