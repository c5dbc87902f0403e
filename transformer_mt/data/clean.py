"""Filters for training pairs that count what they drop and why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator


def strip_pairs(pairs: Iterable[tuple[str, str]], dropped: Counter) -> Iterator[tuple[str, str]]:
    """Strip whitespace; drop pairs with an empty side (counted under 'empty')."""
    for src, tgt in pairs:
        src, tgt = src.strip(), tgt.strip()
        if not src or not tgt:
            dropped["empty"] += 1
            continue
        yield src, tgt


def within_length(
    src_ids: list[list[int]], tgt_ids: list[list[int]], max_tokens: int, dropped: Counter
) -> list[int]:
    """Indices of pairs with at most max_tokens pieces a side (others counted as 'too_long')."""
    kept = [
        i
        for i, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True))
        if len(s) <= max_tokens and len(t) <= max_tokens
    ]
    dropped["too_long"] += len(src_ids) - len(kept)
    return kept
