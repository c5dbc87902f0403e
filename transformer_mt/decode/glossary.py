"""Glossaries: term pairs whose target term a translation must contain wherever the source term
occurs in the sentence (decode.glossary; tmt-serve's `glossary`).

A glossary file is UTF-8 text, a pair a line: the source term, a tab, the target term (a term
may hold spaces; lines that are empty or start with '#' are skipped). A source term occurs in a
sentence where it appears with the same letters up to case (both casefolded, after the
normalisation the training data had, data.unicode_form), not inside a longer word: the
characters before and after it, if any, are neither letters nor digits ("dog" occurs in "The
dog, asleep" and in "dog-friendly", not in "dogma"). Occurrences do not overlap: longer
source terms are matched first, and a term is not matched where it lies within (or across) one
matched already ("red car → rotes Auto" and "car → Auto" give "rotes Auto" alone for "the red
car", both for "the red car and the car"). Each term that occurs gives its target term once, as
written in the glossary, in the order of the terms' first occurrences; the search
(decode/constraints.py) then keeps only translations that contain every one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformer_mt.data.clean import normalise
from transformer_mt.errors import ConfigError, DataError


@dataclass(frozen=True)
class Glossary:
    """Term pairs, their source terms normalised and casefolded for matching."""

    pairs: tuple[tuple[str, str], ...]  # (source term as matched, target term as written)

    @classmethod
    def of_pairs(cls, pairs: list[tuple[str, str]], unicode_form: str | None) -> Glossary:
        """A glossary of (source term, target term) pairs; ConfigError naming the pair that
        has an empty term or a line break."""
        kept = []
        for number, (source, target) in enumerate(pairs):
            source, target = source.strip(), target.strip()
            if not source or not target:
                raise ConfigError(f"glossary pair {number}: a term is empty")
            if any(c in source + target for c in "\r\n\t"):
                raise ConfigError(f"glossary pair {number}: a term holds a tab or a line break")
            kept.append((normalise(source, unicode_form).casefold(), target))
        return cls(tuple(kept))

    @classmethod
    def read(cls, path: str | Path, unicode_form: str | None) -> Glossary:
        """The glossary file `path`; DataError naming the file and line that is not a pair."""
        path = Path(path)
        try:
            raw = path.read_bytes()
        except OSError as error:
            raise ConfigError(f"config key 'decode.glossary': {path}: {error.strerror}") from None
        pairs = []
        for number, line in enumerate(raw.split(b"\n"), start=1):
            try:
                text = line.decode("utf-8").rstrip("\r")
            except UnicodeDecodeError as error:
                raise DataError(f"{path}:{number}: not valid UTF-8 ({error.reason})") from None
            if not text.strip() or text.startswith("#"):
                continue
            fields = text.split("\t")
            if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
                raise DataError(
                    f"{path}:{number}: a glossary line is a source term, a tab and a target term"
                    f" (got {len(fields)} field(s){', one empty' if len(fields) == 2 else ''})"
                )
            pairs.append((fields[0], fields[1]))
        return cls.of_pairs(pairs, unicode_form)

    def terms(self, sentence: str, unicode_form: str | None) -> list[str]:
        """The target terms of the source terms that occur in `sentence` (longer source terms
        first, no two occurrences overlapping), each once, in the order of their first
        occurrence."""
        folded = normalise(sentence, unicode_form).casefold()
        taken: list[tuple[int, int]] = []
        found: dict[str, int] = {}
        for source, target in sorted(self.pairs, key=lambda pair: -len(pair[0])):
            for start in occurrences(folded, source):
                end = start + len(source)
                if any(start < other_end and other_start < end for other_start, other_end in taken):
                    continue
                taken.append((start, end))
                found[target] = min(start, found.get(target, start))
        return sorted(found, key=found.__getitem__)


def occurrences(text: str, term: str) -> list[int]:
    """Where `term` occurs in `text` as a whole word or words (not inside a longer word: no
    letter or digit right before or after it)."""
    places = []
    start = text.find(term)
    while start >= 0:
        end = start + len(term)
        before = start == 0 or not text[start - 1].isalnum()
        after = end == len(text) or not text[end].isalnum()
        if before and after:
            places.append(start)
        start = text.find(term, start + 1)
    return places
