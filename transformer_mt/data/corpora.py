"""Several training corpora (data.corpora): prepared each in a folder of its own, mixed by weight.

The main corpus (data.*) keeps its prepared folder: the tokenizers, its train and valid splits.
Every other corpus is read, cleaned and encoded with those tokenizers into a folder named by the
hash of its content, the settings that clean it and the tokenizers' pieces, so that a run that
changes a weight, or adds a corpus under the same tokenizers (data.spm_model), prepares nothing
again. A tokenizer trained here is trained on a sample of every corpus, so adding a corpus gives
a new tokenizer, and every corpus is encoded again with it.

A weight is an upsampling factor: an epoch holds each pair of a corpus of weight 2 twice, and a
random half (another each epoch) of a corpus of weight 0.5. `CorpusMix` draws the epoch's
examples from (seed, epoch) alone, so a resume continues the same epoch, and a corpus's share of
an epoch does not move when another corpus is added. Where training samples segmentations
(data.*_subword_alpha), each corpus has several stores, and each example of an epoch is read
from one of them, drawn from (seed, epoch) too (data/subword_sampling.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from transformer_mt.config import DataConfig
from transformer_mt.data.binarize import CHUNK_LINES
from transformer_mt.data.clean import single_line
from transformer_mt.data.prepare import (
    STATS_FILE,
    ExtraCorpus,
    PreparedData,
    binarize_split,
    build_folder,
    corpus_settings,
    given_tokenizer_files,
    load_given_tokenizers,
    open_prepared,
    prepare,
    prepared_folder,
    publish,
    read_stats,
    remove_abandoned_builds,
    settings_hash,
    wait_for_folder,
    write_clean_train,
)
from transformer_mt.data.sources import check_training_files, corpus_identity, read_pairs
from transformer_mt.data.store import ParallelTokens, StoredSplit, check_files
from transformer_mt.data.subword_sampling import prepare_samples, sampled_sides, segmentations
from transformer_mt.data.tags import TagScan, check_recorded, tag_keys
from transformer_mt.data.tokenizer import Tokenizer, Tokenizers
from transformer_mt.errors import ConfigError, DataError

log = logging.getLogger(__name__)


def prepare_corpora(cfg: DataConfig, *, build: bool = True) -> PreparedData:
    """The main corpus's prepared folder with every other corpus's (and their sampled
    segmentations, where training samples them), each built first where it is missing
    (build=False: opened when rank 0 has built it, as the other ranks do); DataError for a tag
    that the text holds, ConfigError for one a given tokenizer lacks."""
    if build:  # refused before anything is prepared
        for name in cfg.corpora:
            check_training_files(cfg.corpus(name))
    if cfg.spm_model is not None:
        check_tag_pieces(cfg, load_given_tokenizers(cfg).src)
    main = prepare(cfg) if build else open_prepared(prepared_folder(cfg))
    extra = []
    for name in cfg.corpora:
        folder = extra_folder(cfg, name, main.tokenizers)
        if (folder / STATS_FILE).is_file():
            log.info("reusing prepared corpus %s: %s", name, folder)
        elif build:
            build_extra(cfg, name, folder, main.tokenizers)
        else:
            wait_for_folder(folder)
        extra.append(open_extra(name, folder, main.tokenizers))
    check_recorded(tag_keys(cfg), tag_records(cfg, [main.folder, *(e.folder for e in extra)]))
    if sampled_sides(cfg):
        for folder, train in [(main.folder, main.train), *((e.folder, e.train) for e in extra)]:
            prepare_samples(cfg, folder, main.tokenizers, train, build=build)
    return dataclasses.replace(main, extra=tuple(extra))


def extra_folder(cfg: DataConfig, name: str, tokenizers: Tokenizers) -> Path:
    """Where corpus `name` of data.corpora is prepared: named by its training split's content,
    the settings that clean it, and the pieces of the tokenizers that encode it."""
    settings = corpus_settings(cfg.corpus(name), splits=("train",))
    settings["tokenizers"] = list(tokenizers.sha256)
    return Path(cfg.prepared_dir) / f"{name}-{settings_hash(settings)}"


def build_extra(cfg: DataConfig, name: str, folder: Path, tokenizers: Tokenizers) -> None:
    """Read, clean and encode corpus `name`'s training split into `folder` (built beside it and
    renamed when complete, as the main corpus's)."""
    corpus = cfg.corpus(name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_builds(folder.parent)
    with build_folder(folder) as temporary:
        log.info("preparing corpus %s (%s) into %s", name, corpus_identity(corpus), folder.name)
        dropped: Counter = Counter()
        scan = TagScan(tag_keys(cfg))
        read = write_clean_train(corpus, temporary, dropped, None, scan)
        small = read <= 4 * CHUNK_LINES
        kept = binarize_split(corpus, "train", temporary, tokenizers, dropped, small=small)
        counted = {reason: count for reason, count in dropped.items() if count}
        log.info("corpus %s: kept %d pairs; dropped %s", name, kept, counted or "none")
        stats = {
            "source": corpus_identity(corpus),
            "corpus": name,
            "splits": {"train": {"kept": kept, "dropped": counted}},
            "tokenizers": list(tokenizers.sha256),
            "tag_like": scan.found,
        }
        publish(temporary, folder, stats)


def open_extra(name: str, folder: Path, tokenizers: Tokenizers) -> ExtraCorpus:
    """A prepared corpus, checked as the main corpus's folder is when it is opened."""
    check_files(folder, read_stats(folder).get("files", {}))
    vocab_sizes = (tokenizers.src.vocab_size, tokenizers.tgt.vocab_size)
    return ExtraCorpus(name, folder, ParallelTokens.load(folder, "train", vocab_sizes))


def tag_records(cfg: DataConfig, folders: list[Path]) -> list[dict[str, str]]:
    """Each folder's record of the strings of a tag's form in its text; where the run has tags,
    DataError for a folder prepared before such records were kept."""
    records = []
    for folder in folders:
        record = read_stats(folder).get("tag_like")
        if record is None and cfg.tags:
            raise DataError(
                f"{folder} was prepared before tags existed, so whether its text holds "
                f"{', '.join(cfg.tags)} is not recorded: delete the folder to prepare it again"
            )
        records.append(record or {})
    return records


def check_tag_pieces(cfg: DataConfig, source: Tokenizer) -> None:
    """ConfigError for a tag that a given SentencePiece model (data.spm_model) has no control
    piece for: its ids mean what that model says, and tags cannot be added to it."""
    processor = source.processor
    for tag, key in tag_keys(cfg).items():
        piece = processor.piece_to_id(tag)
        if piece == processor.unk_id() or not processor.is_control(piece):
            files = ", ".join(map(str, given_tokenizer_files(cfg)))
            raise ConfigError(
                f"config key '{key}': the tag {tag} is no piece of the given SentencePiece model "
                f"(data.spm_model: {files}); use the tags it was trained with, or let the run "
                "train its own (data.spm_model=null)"
            )


def language_pairs(cfg: DataConfig) -> dict[str, DataConfig]:
    """Each language pair of the training corpora ("de-en"), the main corpus's first, with the
    data configuration whose valid and test splits score it: the main corpus's for its own pair,
    else that of the first corpus of the pair (its source, folder or dataset and languages, with
    the main corpus's split names: data.valid_split, data.test_split)."""
    pairs = {f"{cfg.src_lang}-{cfg.tgt_lang}": cfg}
    for name in cfg.corpora:
        corpus = cfg.corpus(name)
        pairs.setdefault(f"{corpus.src_lang}-{corpus.tgt_lang}", corpus)
    return pairs


def raw_pairs(cfg: DataConfig, split: str, count: int | None = None) -> tuple[list[str], list[str]]:
    """The first `count` (None: all) sources and references of a split as read: not cleaned,
    normalised or filtered (BLEU scores raw references), each one line."""
    pairs = itertools.islice(read_pairs(cfg, split), count)
    sources, references = [], []
    for source, reference in pairs:
        sources.append(single_line(source))
        references.append(single_line(reference))
    return sources, references


@dataclass(frozen=True)
class MixPart:
    """One corpus in the mix: its stores (its training split's segmentation, or each of its
    sampled ones: data/subword_sampling.py), each with the ids put before each source (its
    target language's tag, where the corpora have several, then its own tag); its weight; its
    pairs."""

    name: str
    stores: tuple[StoredSplit, ...]
    weight: float
    size: int


class CorpusMix:
    """The training corpora as one set of examples: pair i of store s (of every part's stores in
    order) is example offsets[s] + i. Each epoch's examples (`epoch_examples`) hold each part's
    pairs as its weight says, each from one of the part's stores; the batches are cut from them
    as from one corpus (data/batching.epoch_batches)."""

    def __init__(self, parts: list[MixPart], tokens: list[ParallelTokens]):
        """tokens: each store's pairs, in the order of `stores`."""
        self.parts = parts
        counts = [len(part.stores) for part in parts]
        self.offsets = np.cumsum([0, *(part.size for part in parts for _ in part.stores)])
        self.first_store = np.cumsum([0, *counts])[:-1]
        self.store_part = np.repeat(np.arange(len(parts)), counts)
        stores = self.stores
        self.src_lengths = np.concatenate(
            [
                data.src.lengths + len(store.src_prefix)
                for data, store in zip(tokens, stores, strict=True)
            ]
        )
        self.tgt_lengths = np.concatenate([data.tgt.lengths for data in tokens])

    @classmethod
    def of(cls, data: PreparedData, cfg: DataConfig) -> CorpusMix:
        """The main corpus (data.*) first, then data.corpora in their order; each corpus's
        sampled segmentations where data.*_subword_alpha asks for them (prepare_corpora drew
        them)."""
        source = data.tokenizers.src.processor
        languages = cfg.language_tags
        named = [(cfg.name, data.folder, data.train, cfg)]
        named += [(e.name, e.folder, e.train, cfg.corpus(e.name)) for e in data.extra]
        parts, tokens = [], []
        for name, folder, train, corpus in named:
            tags = [languages.get(corpus.tgt_lang), corpus.tag]
            prefix = tuple(source.piece_to_id(tag) for tag in tags if tag is not None)
            stores = segmentations(cfg, folder, prefix)
            parts.append(MixPart(name, stores, corpus.weight, len(train)))
            if not sampled_sides(cfg):
                tokens.append(train)
            else:
                tokens += [ParallelTokens.load_sides(store.src, store.tgt) for store in stores]
        return cls(parts, tokens)

    @property
    def stores(self) -> list[StoredSplit]:
        return [store for part in self.parts for store in part.stores]

    def epoch_examples(self, seed: int, epoch: int) -> np.ndarray:
        """The examples of an epoch (int64, in corpus order; the batches shuffle them): each
        part's pairs int(weight) times, and a random share of them (weight's fraction, drawn
        without repeats from (seed, epoch, part)); each from one of the part's stores, drawn from
        (seed, epoch, part) where it has several. One corpus of weight 1 and one store: 0, 1,
        ..., N - 1."""
        examples = []
        for index, part in enumerate(self.parts):
            whole, fraction = divmod(part.weight, 1.0)
            pairs = [np.tile(np.arange(part.size), int(whole))]
            drawn = round(fraction * part.size)
            if drawn:
                rng = np.random.default_rng([seed, epoch, index, 1])
                pairs.append(np.sort(rng.choice(part.size, drawn, replace=False)))
            chosen = np.concatenate(pairs)
            store = self.first_store[index]
            if len(part.stores) > 1:
                rng = np.random.default_rng([seed, epoch, index, 2])
                store = store + rng.integers(len(part.stores), size=len(chosen))
            examples.append(self.offsets[store] + chosen)
        return np.concatenate(examples).astype(np.int64)

    def counts(self, examples: np.ndarray) -> dict[str, dict[str, int]]:
        """Per corpus: the pairs, source tokens (its tag counted) and target tokens in
        `examples`."""
        part = self.store_part[np.searchsorted(self.offsets, examples, side="right") - 1]
        sizes = len(self.parts)
        pairs = np.bincount(part, minlength=sizes)
        src = np.bincount(part, weights=self.src_lengths[examples], minlength=sizes)
        tgt = np.bincount(part, weights=self.tgt_lengths[examples], minlength=sizes)
        return {
            p.name: {"pairs": int(pairs[i]), "src_tokens": int(src[i]), "tgt_tokens": int(tgt[i])}
            for i, p in enumerate(self.parts)
        }
