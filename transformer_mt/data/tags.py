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
from dataclasses import dataclass, field

from transformer_mt.config import TAG_FORM, DataConfig
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.errors import ConfigError, DataError

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


@dataclass(frozen=True)
class TargetLanguages:
    """The languages a model translates into: its one (`main`), or several, each with the id of
    its tag (`tags`), which goes first before every source of a translation into it."""

    main: str
    tags: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: DataConfig, source: Tokenizer) -> TargetLanguages:
        """A run's, from its data settings and source tokenizer."""
        processor = source.processor
        tags = {lang: processor.piece_to_id(tag) for lang, tag in cfg.language_tags.items()}
        return cls(cfg.tgt_lang, tags)

    @property
    def names(self) -> list[str]:
        return list(self.tags) or [self.main]

    def prefix(self, language: str | None) -> list[int]:
        """The ids to put before every source of a translation into `language` (decode.tgt_lang);
        ConfigError naming decode.tgt_lang for a language the model was not trained into, or
        for none where it was trained into several."""
        if not self.tags:
            if language not in (None, self.main):
                raise ConfigError(
                    f"config key 'decode.tgt_lang': this model translates into {self.main} only, "
                    f"not {language}"
                )
            return []
        if language not in self.tags:
            said = "no language was named" if language is None else f"not into {language}"
            raise ConfigError(
                f"config key 'decode.tgt_lang': this model translates into "
                f"{', '.join(self.tags)} ({said}): name one, as decode.tgt_lang={self.names[0]}"
            )
        return [self.tags[language]]
