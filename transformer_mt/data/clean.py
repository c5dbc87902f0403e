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


def clean_text_pairs(
    pairs: Iterable[tuple[str, str]],
    dropped: Counter,
    *,
    unicode_form: str | None = "NFC",
    dedupe: bool = False,
) -> Iterator[tuple[str, str]]:
    """Strip and normalise both sides; drop empty pairs ('empty') and repeats ('duplicate').

    De-duplication keeps an 8-byte digest per distinct pair, not the text: about 100 bytes of
    memory per pair in a Python set (450 MB for 4.5M pairs).
    """
    seen: set[bytes] = set()
    for src, tgt in pairs:
        src, tgt = normalise(src.strip(), unicode_form), normalise(tgt.strip(), unicode_form)
        if not src or not tgt:
            dropped["empty"] += 1
            continue
        if dedupe:
            digest = hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=8).digest()
            if digest in seen:
                dropped["duplicate"] += 1
                continue
            seen.add(digest)
        yield src, tgt


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
