"""One SentencePiece model shared by source and target: train, load, encode, decode."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from transformer_mt.errors import ConfigError, DataError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class Tokenizer:
    """Text <-> piece ids. pad=0, unk=1, bos=2, eos=3."""

    def __init__(self, model_path: str | os.PathLike):
        path = Path(model_path)
        if not path.is_file():
            raise DataError(f"{path}: SentencePiece model not found")
        self.path = path
        self.processor = spm.SentencePieceProcessor(model_file=str(path))
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()

    def encode(self, sentences: list[str]) -> list[list[int]]:
        return self.processor.encode(sentences, out_type=int)

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.processor.decode(ids)


def reservoir_sample(sentences: Iterable[str], size: int, seed: int) -> list[str]:
    """A uniform sample of at most `size` sentences, in bounded memory."""
    rng = random.Random(seed)
    sample: list[str] = []
    for seen, sentence in enumerate(sentences):
        if seen < size:
            sample.append(sentence)
        else:
            slot = rng.randint(0, seen)
            if slot < size:
                sample[slot] = sentence
    return sample


def train_tokenizer(
    sentences: Iterable[str],
    model_path: str | os.PathLike,
    *,
    vocab_size: int,
    sample_size: int,
    seed: int = 1,
) -> Tokenizer:
    """Train BPE on a sample of `sentences` (source and target mixed); save it to model_path."""
    sample = reservoir_sample((s for s in sentences if s.strip()), sample_size, seed)
    if not sample:
        raise DataError("cannot train SentencePiece: no non-empty training sentences")
    model_path = Path(model_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample),
            model_prefix=str(model_path.with_suffix("")),
            vocab_size=vocab_size,
            model_type="bpe",
            character_coverage=1.0,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            num_threads=max(1, os.cpu_count() or 1),
            minloglevel=2,
        )
    except RuntimeError as error:
        if "Vocabulary size" in str(error) or "vocab_size" in str(error):
            raise ConfigError(
                f"config key 'data.vocab_size': {vocab_size} is too large for this corpus ({error})"
            ) from None
        raise
    return Tokenizer(model_path)
