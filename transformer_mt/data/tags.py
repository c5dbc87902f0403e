"""Tags: pieces put before a corpus's sources (<BT> for back-translation, a domain's name).

A tag is a SentencePiece control piece: never split, never produced from text, so no sentence
can spell one by accident. A tag that the text itself holds would still confuse whoever reads
the data or the model's inputs, so it is refused. To refuse it without reading a corpus again
when tags change, preparation records every string of a tag's form the text holds, with where
it first occurs (`TagScan`), in the prepared folder's stats.json ("tag_like").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

from transformer_mt.config import TAG_FORM, DataConfig
from transformer_mt.errors import DataError

TAG_LIKE = re.compile(TAG_FORM)


def tag_keys(cfg: DataConfig) -> dict[str, str]:
    """Each tag with the config key that sets it (the first, where corpora share one): a target
    language's (where there are several) by the key of its language."""
    keys = {}
    languages = cfg.language_tags
    if languages:  # a language's tag, by the first corpus into it
        keys[languages[cfg.tgt_lang]] = "data.tgt_lang"
        for name in cfg.corpora:
            tag = languages[cfg.corpus(name).tgt_lang]
            keys.setdefault(tag, f"data.corpora.{name}.tgt_lang")
    if cfg.tag is not None:
        keys.setdefault(cfg.tag, "data.tag")
    for name in cfg.corpora:
        tag = cfg.corpus_settings(name).tag
        if tag is not None:
            keys.setdefault(tag, f"data.corpora.{name}.tag")
    return keys


def occurs(tag: str, key: str, where: str) -> DataError:
    return DataError(
        f"config key '{key}': the tag {tag} occurs in the text ({where}); choose a tag the text "
        "does not hold"
    )


class TagScan:
    """Records the strings of a tag's form in the pairs streaming past, with where each first
    occurs; refuses the run's own tags (`tags`: tag -> its config key) at once."""

    def __init__(self, tags: dict[str, str]):
        self.tags, self.found = tags, {}

    def scanned(
        self, pairs: Iterable[tuple[str, str]], where: Callable[[int, int], str]
    ) -> Iterator[tuple[str, str]]:
        """The pairs as they are; where(number, side): pair `number`'s (from 1) place, for side 0
        (source) or 1 (target)."""
        for number, pair in enumerate(pairs, start=1):
            for side, text in enumerate(pair):
                if "<" in text:
                    for match in TAG_LIKE.findall(text):
                        self.record(match, lambda n=number, s=side: where(n, s))
            yield pair

    def record(self, match: str, where: Callable[[], str]) -> None:
        if match in self.found:
            return
        self.found[match] = where()
        if match in self.tags:
            raise occurs(match, self.tags[match], self.found[match])


def check_recorded(tags: dict[str, str], records: Iterable[dict[str, str]]) -> None:
    """DataError for the first tag that a prepared folder's record ("tag_like") holds."""
    for record in records:
        for tag, key in tags.items():
            if tag in record:
                raise occurs(tag, key, record[tag])
