"""SentencePiece: one model shared by source and target (the paper's), or one per side;
train, load, encode, decode."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from transformer_mt.device import usable_cpus
from transformer_mt.errors import ConfigError, DataError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_PIECES = ["<pad>", "<unk>", "<s>", "</s>"]
"""SentencePiece's spelling of our PAD, UNK, BOS, EOS (ids 0-3)."""
SHARED_FILE, SRC_FILE, TGT_FILE = "spm.model", "spm.src.model", "spm.tgt.model"
TOKENIZER_FILES = (SHARED_FILE, SRC_FILE, TGT_FILE)


class Tokenizer:
    """Text <-> piece ids. pad=0, unk=1, bos=2, eos=3."""

    def __init__(self, model_path: str | os.PathLike):
        path = Path(model_path)
        if not path.is_file():
            raise DataError(f"{path}: SentencePiece model not found")
        self.path = path
        try:
            self.processor = spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as error:  # SentencePiece's "could not parse ModelProto"
            raise DataError(
                f"{path}: not a readable SentencePiece model (empty, truncated or corrupt); put "
                "an intact copy in its place: a run folder's copy comes from the prepared folder "
                "its prepared.json names, and a prepared folder is rebuilt when deleted"
            ) from error
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()

    def encode(self, sentences: list[str], *, alpha: float = 0.0) -> list[list[int]]:
        """Each sentence's best segmentation; with alpha > 0, a sampled one (subword
        regularization, SentencePiece's enable_sampling): of a BPE model, each merge skipped with
        probability alpha (BPE-dropout); of a unigram model, drawn from its lattice smoothed by
        alpha."""
        if alpha <= 0.0:
            return self.processor.encode(sentences, out_type=int)
        return self.processor.encode(
            sentences, out_type=int, enable_sampling=True, alpha=alpha, nbest_size=-1
        )

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.processor.decode(ids)

    def pieces(self, ids: list[int]) -> list[str]:
        """The pieces as SentencePiece spells them ('▁' starts a word; <0xNN>: a byte)."""
        return [self.processor.id_to_piece(int(i)) for i in ids]

    @functools.cached_property
    def sha256(self) -> str:
        """The sha256 of what the ids mean: every piece with its score (BPE's merge order) and
        kind, in id order. Not of the file's bytes: SentencePiece's file also records where and
        with how many threads it was trained, so a prepared folder built again holds other bytes
        for the same pieces."""
        digest, processor = hashlib.sha256(), self.processor
        for i in range(self.vocab_size):
            kinds = (processor.is_control, processor.is_unknown, processor.is_byte)
            kind = [is_kind(i) for is_kind in (*kinds, processor.is_unused)]
            entry = [processor.id_to_piece(i), processor.get_score(i), kind]
            digest.update(json.dumps(entry).encode() + b"\n")
        return digest.hexdigest()


@dataclass(frozen=True)
class Tokenizers:
    """The source and target tokenizers: one shared model (the paper's) or one per side."""

    src: Tokenizer
    tgt: Tokenizer

    @property
    def shared(self) -> bool:
        return self.src.path == self.tgt.path

    @property
    def files(self) -> list[Path]:
        return [self.src.path] if self.shared else [self.src.path, self.tgt.path]

    @property
    def sha256(self) -> tuple[str, ...]:
        """Tokenizer.sha256 of each file, in the order of `files`."""
        return (self.src.sha256,) if self.shared else (self.src.sha256, self.tgt.sha256)


def vocabulary(tokenizer: Tokenizer) -> list[str]:
    """The tokenizer's pieces in id order (each piece's position in the list is its id), checked
    to start with SPECIAL_PIECES (what the exporters write as the model's vocabulary)."""
    pieces = [tokenizer.processor.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    if pieces[:4] != SPECIAL_PIECES:
        raise DataError(
            f"{tokenizer.path}: pieces 0-3 are {pieces[:4]}, not {' '.join(SPECIAL_PIECES)}"
        )
    return pieces


def load_tokenizers(folder: Path) -> Tokenizers:
    """The tokenizer files in a prepared folder or a run folder."""
    if (folder / SHARED_FILE).is_file():
        shared = Tokenizer(folder / SHARED_FILE)
        return Tokenizers(shared, shared)
    if (folder / SRC_FILE).is_file():
        return Tokenizers(Tokenizer(folder / SRC_FILE), Tokenizer(folder / TGT_FILE))
    raise DataError(
        f"{folder}: no SentencePiece model ({SHARED_FILE}, or {SRC_FILE} and {TGT_FILE})"
    )


class Reservoir:
    """A uniform random sample of at most `size` items from a stream, in bounded memory."""

    def __init__(self, size: int, seed: int):
        self.size, self.seen, self.items = size, 0, []
        self.rng = random.Random(seed)

    def add(self, item: str) -> None:
        if self.seen < self.size:
            self.items.append(item)
        else:
            slot = self.rng.randint(0, self.seen)
            if slot < self.size:
                self.items[slot] = item
        self.seen += 1


def train_tokenizer(
    sentences: list[str],
    model_path: str | os.PathLike,
    *,
    vocab_size: int,
    character_coverage: float = 0.9999,
    control_symbols: list[str] | None = None,
) -> Tokenizer:
    """Train BPE on `sentences` (source and target mixed, already sampled); save to model_path.

    The text is used as it is: data.unicode_form, applied before, is the only normalisation
    (SentencePiece's own NFKC rule is off, so pieces decode to exactly the text they encode).
    Characters outside the `character_coverage` share of the sample's characters, and any
    character never seen, are spelled in UTF-8 byte pieces (byte fallback): nothing encodes to
    <unk>, and decoding gives every character back. `control_symbols` (tags) get pieces of
    their own after the special ones, which encoding never produces from text.
    """
    sentences = [s for s in sentences if s.strip()]
    if not sentences:
        raise DataError("cannot train SentencePiece: no non-empty training sentences")
    model_path = Path(model_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_prefix=str(model_path.with_suffix("")),
            vocab_size=vocab_size,
            model_type="bpe",
            character_coverage=character_coverage,
            normalization_rule_name="identity",
            byte_fallback=True,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            **({"control_symbols": control_symbols} if control_symbols else {}),
            num_threads=usable_cpus(),
            minloglevel=2,
        )
    except RuntimeError as error:
        message = str(error)
        if "smaller than required_chars" in message:  # the sample's characters need more pieces
            problem = "is too small: the sample's characters alone need more pieces"
        elif "Vocabulary size" in message or "vocab_size" in message:
            problem = "is too large for this corpus"
        else:
            raise
        raise ConfigError(
            f"config key 'data.vocab_size': {vocab_size} {problem} ({message})"
        ) from error
    return Tokenizer(model_path)
