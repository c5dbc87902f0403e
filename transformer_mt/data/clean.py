"""Filters for training pairs that count what they drop and why.

Text filters run on strings as they stream past (strip, Unicode normalisation, empty pairs,
exact duplicates); length filters run on piece counts after encoding (too long, length ratio).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator

import numpy as np

LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
"""Every character at which Python's str.splitlines() breaks a line."""


def single_line(text: str) -> str:
    """Line breaks inside a sentence (in HF datasets, or spelled by a model in byte pieces) as
    spaces: one sentence stays one line of a text file, for any reader."""
    return LINE_BREAKS.sub(" ", text)


def normalise(text: str, form: str | None) -> str:
    return unicodedata.normalize(form, text) if form else text


CHARS_PER_PIECE_BOUND = 20
"""A line longer than this many characters per allowed piece is too long before it is encoded:
SentencePiece's pieces are at most 16 characters (its max_sentencepiece_length), so such a line
has more pieces than data.max_tokens_per_sentence allows unless normalising shrinks it a lot
(NFC composing Hangul jamo or combining marks is the one case)."""


def clean_text_pairs(
    pairs: Iterable[tuple[str, str]],
    dropped: Counter,
    *,
    unicode_form: str | None = "NFC",
    dedupe: bool = False,
    max_chars: int | None = None,
) -> Iterator[tuple[str, str]]:
    """Strip and normalise both sides; drop empty pairs ('empty'), pairs with a side longer than
    max_chars ('too_long') and repeats ('duplicate').

    The length check comes before normalising: CPython's NFC is quadratic in a run of combining
    marks (cpython#149079), so one crafted 1 MB line would take minutes.
    De-duplication keeps an 8-byte digest per distinct pair, not the text: about 100 bytes of
    memory per pair in a Python set (450 MB for 4.5M pairs).
    """
    seen: set[bytes] = set()
    for src, tgt in pairs:
        src, tgt = src.strip(), tgt.strip()
        if max_chars is not None and max(len(src), len(tgt)) > max_chars:
            dropped["too_long"] += 1
            continue
        src, tgt = normalise(src, unicode_form), normalise(tgt, unicode_form)
        if not src or not tgt:
            dropped["empty"] += 1
            continue
        if dedupe:
            digest = pair_digest(src, tgt)
            if digest in seen:
                dropped["duplicate"] += 1
                continue
            seen.add(digest)
        yield src, tgt


def pair_digest(src: str, tgt: str) -> bytes:
    """8 bytes that differ for different pairs (but for a 2^-64 chance): each side is prefixed
    with its length, so ("a\\tb", "c") and ("a", "b\\tc") do not collide as joined text would."""
    digest = hashlib.blake2b(digest_size=8)
    for side in (src.encode(), tgt.encode()):
        digest.update(len(side).to_bytes(8, "little"))
        digest.update(side)
    return digest.digest()


def length_filter(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    *,
    max_tokens: int,
    max_ratio: float,
    dropped: Counter,
) -> np.ndarray:
    """Boolean keep mask: at most max_tokens pieces a side and a length ratio of at most max_ratio.

    The ratio is longer / shorter side in pieces; 0 disables the ratio filter.
    """
    too_long = (src_lengths > max_tokens) | (tgt_lengths > max_tokens)
    keep = ~too_long
    dropped["too_long"] += int(too_long.sum())
    if max_ratio > 0:
        longer = np.maximum(src_lengths, tgt_lengths)
        shorter = np.maximum(np.minimum(src_lengths, tgt_lengths), 1)
        bad_ratio = keep & (longer > max_ratio * shorter)
        dropped["length_ratio"] += int(bad_ratio.sum())
        keep &= ~bad_ratio
    return keep
