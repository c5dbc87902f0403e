"""Corpus to run folder: clean, train the shared SentencePiece model, binarize train and valid."""

from __future__ import annotations

import itertools
import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from transformer_mt.config import DataConfig
from transformer_mt.data.clean import strip_pairs, within_length
from transformer_mt.data.sources import corpus_identity, read_pairs
from transformer_mt.data.store import ParallelTokens, TokenArray
from transformer_mt.data.tokenizer import Tokenizer, train_tokenizer
from transformer_mt.errors import DataError

log = logging.getLogger(__name__)

TOKENIZER_FILE = "spm.model"


@dataclass(frozen=True)
class PreparedData:
    tokenizer: Tokenizer
    train: ParallelTokens
    valid: ParallelTokens


def prepare(cfg: DataConfig, run_dir: Path, *, seed: int = 1) -> PreparedData:
    """Tokenizer and binarized train/valid splits in run_dir, reused when already there."""
    data_dir = run_dir / "data"
    tokenizer_path = run_dir / TOKENIZER_FILE
    done_marker = data_dir / "stats.json"
    if tokenizer_path.is_file() and done_marker.is_file():
        log.info("reusing prepared data in %s", data_dir)
        return PreparedData(
            Tokenizer(tokenizer_path),
            ParallelTokens.load(data_dir, "train"),
            ParallelTokens.load(data_dir, "valid"),
        )
    log.info("preparing %s", corpus_identity(cfg))
    dropped: Counter = Counter()
    train_pairs = list(strip_pairs(read_pairs(cfg, "train"), dropped))
    if not train_pairs:
        raise DataError(
            f"the training split of {corpus_identity(cfg)} is empty after cleaning "
            f"(dropped: {dict(dropped)})"
        )
    text = itertools.chain.from_iterable(train_pairs)
    log.info(
        "training SentencePiece (BPE, %d pieces) on %d pairs", cfg.vocab_size, len(train_pairs)
    )
    tokenizer = train_tokenizer(
        text,
        tokenizer_path,
        vocab_size=cfg.vocab_size,
        sample_size=cfg.spm_sample_sentences,
        seed=seed,
    )
    stats = {"dropped_train": {}}
    train = binarize(tokenizer, train_pairs, cfg.max_tokens_per_sentence, dropped)
    stats["dropped_train"] = dict(dropped)
    valid_pairs = list(strip_pairs(read_pairs(cfg, "valid"), Counter()))
    valid = binarize(tokenizer, valid_pairs, cfg.max_tokens_per_sentence, Counter())
    train.save(data_dir, "train")
    valid.save(data_dir, "valid")
    stats.update(train_pairs=len(train), valid_pairs=len(valid), vocab_size=tokenizer.vocab_size)
    done_marker.write_text(json.dumps(stats, indent=2))
    log.info(
        "prepared %d train / %d valid pairs; dropped %s",
        len(train),
        len(valid),
        dict(dropped) or "none",
    )
    return PreparedData(tokenizer, train, valid)


def binarize(
    tokenizer: Tokenizer, pairs: list[tuple[str, str]], max_tokens: int, dropped: Counter
) -> ParallelTokens:
    src_ids = tokenizer.encode([src for src, _ in pairs])
    tgt_ids = tokenizer.encode([tgt for _, tgt in pairs])
    kept = within_length(src_ids, tgt_ids, max_tokens, dropped)
    return ParallelTokens(
        TokenArray.from_lists([src_ids[i] for i in kept]),
        TokenArray.from_lists([tgt_ids[i] for i in kept]),
    )
