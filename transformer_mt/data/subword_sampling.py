"""Subword regularization: sampled segmentations of the training pairs, drawn once, one of them
picked for each pair of each epoch.

Where data.src_subword_alpha or data.tgt_subword_alpha is above 0, each epoch trains on one of
data.subword_samples segmentations of each training sentence of that side, sampled by
SentencePiece (Kudo 2018; of a BPE model, BPE-dropout: Provilkov et al. 2020); valid and test keep
the one best segmentation. The samples are drawn when a corpus is prepared, into a folder beside
its prepared folder named by that folder and the sampling settings (a change of alpha encodes
nothing else again), and `CorpusMix` picks one for each pair of an epoch from (seed, epoch), so a
resume continues the same epoch bitwise and the epoch's batches are cut knowing every length.
Drawing them in the loader instead would give each epoch new ones, but SentencePiece's sampling
does not repeat itself in another process (0.2.3 gave other segmentations in each new process
after the same spm.set_random_generator_seed): a resumed epoch would not be the one that was
cut, and its batches could not be planned before it is encoded.

The text sampled is the stored best segmentation decoded: the text it encoded, up to what the
tokenizer's normalisation changed (ours normalises nothing of its own), which encoding again
changes no further. A sample longer than data.max_tokens_per_sentence keeps the best
segmentation instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from transformer_mt.config import DataConfig
from transformer_mt.data.binarize import CHUNK_LINES, encoded_chunks
from transformer_mt.data.prepare import (
    SAMPLING_KEYS,
    STATS_FILE,
    build_folder,
    publish,
    read_stats,
    remove_abandoned_builds,
    settings_hash,
    wait_for_folder,
)
from transformer_mt.data.store import (
    ParallelTokens,
    StoredSplit,
    TokenArray,
    TokenArrayWriter,
    check_files,
    damaged,
    token_dtype,
)
from transformer_mt.data.tokenizer import Tokenizers
from transformer_mt.device import usable_cpus

log = logging.getLogger(__name__)

SAMPLED_MARK = ".sampled-"
SIDES = ("src", "tgt")


def sampled_sides(cfg: DataConfig) -> tuple[str, ...]:
    """The sides whose segmentations are sampled: src, tgt, both or none."""
    alphas = (cfg.src_subword_alpha, cfg.tgt_subword_alpha)
    return tuple(side for side, alpha in zip(SIDES, alphas, strict=True) if alpha > 0)


def sampled_folder(cfg: DataConfig, corpus_folder: Path) -> Path:
    """Where the samples of the corpus prepared in `corpus_folder` lie (its name holds the
    corpus's content and tokenizers already; this adds the sampling settings)."""
    settings = {key: getattr(cfg, key) for key in SAMPLING_KEYS}
    return corpus_folder.parent / f"{corpus_folder.name}{SAMPLED_MARK}{settings_hash(settings)}"


def segmentations(
    cfg: DataConfig, corpus_folder: Path, src_prefix: tuple[int, ...]
) -> tuple[StoredSplit, ...]:
    """The training split of the corpus in `corpus_folder` as each epoch may read it: the best
    segmentation alone, or one store for each sample (its sampled sides from the samples'
    folder, the others the best segmentation)."""
    sides = sampled_sides(cfg)
    if not sides:
        return (StoredSplit.of(corpus_folder, "train", src_prefix),)
    folder = sampled_folder(cfg, corpus_folder)

    def side_store(side: str, sample: int) -> Path:
        if side in sides:
            return folder / f"train.{sample}.{side}"
        return corpus_folder / f"train.{side}"

    return tuple(
        StoredSplit(side_store("src", k), side_store("tgt", k), src_prefix)
        for k in range(cfg.subword_samples)
    )


def prepare_samples(
    cfg: DataConfig,
    corpus_folder: Path,
    tokenizers: Tokenizers,
    train: ParallelTokens,
    *,
    build: bool = True,
) -> Path:
    """The samples' folder of the corpus in `corpus_folder` (its training pairs `train`), drawn
    first where it is missing (build=False: opened when rank 0 has drawn them), checked as a
    prepared folder is."""
    folder = sampled_folder(cfg, corpus_folder)
    if (folder / STATS_FILE).is_file():
        log.info("reusing sampled segmentations %s", folder.name)
    elif build:
        draw_samples(cfg, corpus_folder, folder, tokenizers, train)
    else:
        wait_for_folder(folder)
    check_files(folder, read_stats(folder).get("files", {}))
    vocab_sizes = {"src": tokenizers.src.vocab_size, "tgt": tokenizers.tgt.vocab_size}
    for side in sampled_sides(cfg):
        for sample in range(cfg.subword_samples):
            prefix = folder / f"train.{sample}.{side}"
            sentences = len(TokenArray.load(prefix, vocab_size=vocab_sizes[side]))
            if sentences != len(train):
                raise damaged(prefix, f"{sentences} sentences, but its corpus has {len(train)}")
    return folder


def draw_samples(
    cfg: DataConfig,
    corpus_folder: Path,
    folder: Path,
    tokenizers: Tokenizers,
    train: ParallelTokens,
) -> None:
    """Sample data.subword_samples segmentations of every training sentence of each sampled
    side into `folder` (built beside it and renamed when complete, as a prepared folder)."""
    sides, samples = sampled_sides(cfg), cfg.subword_samples
    alphas = (cfg.src_subword_alpha, cfg.tgt_subword_alpha)
    started = time.perf_counter()
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_builds(folder.parent)
    dtype = token_dtype(max(tokenizers.src.vocab_size, tokenizers.tgt.vocab_size))
    workers = 1 if len(train) <= 4 * CHUNK_LINES else cfg.num_workers or usable_cpus()
    models = (str(tokenizers.src.path), str(tokenizers.tgt.path))
    kept_best = dict.fromkeys(sides, 0)
    log.info(
        "sampling %d segmentations of %s's %d training pairs (%s; alpha %s)",
        samples,
        corpus_folder.name,
        len(train),
        "+".join(sides),
        alphas,
    )
    with build_folder(folder) as temporary, ExitStack() as stack:
        writers = {
            (k, side): stack.enter_context(TokenArrayWriter(temporary / f"train.{k}.{side}", dtype))
            for k in range(samples)
            for side in sides
        }
        chunks = sample_chunks(train, tokenizers, sides, samples, alphas)
        for index, encoded in enumerate(encoded_chunks(chunks, models, workers)):
            chunk, sample = divmod(index, samples)
            start = chunk * CHUNK_LINES
            for side, tokens, lengths in zip(SIDES, encoded[::2], encoded[1::2], strict=True):
                if side not in sides:
                    continue
                best = train.src if side == "src" else train.tgt
                tokens, lengths, replaced = capped(
                    tokens, lengths, best, start, cfg.max_tokens_per_sentence
                )
                kept_best[side] += replaced
                writers[sample, side].append(tokens, lengths)
        stack.close()  # the writers write their indexes before the folder is sealed
        stats = {
            "corpus": corpus_folder.name,
            "samples": samples,
            "alphas": dict(zip(SIDES, alphas, strict=True)),
            "kept_best": kept_best,
            "seconds": round(time.perf_counter() - started, 1),
        }
        publish(temporary, folder, stats)
    log.info(
        "sampled in %.0f s; samples over data.max_tokens_per_sentence, kept best: %s",
        time.perf_counter() - started,
        kept_best,
    )


def sample_chunks(
    train: ParallelTokens,
    tokenizers: Tokenizers,
    sides: tuple[str, ...],
    samples: int,
    alphas: tuple[float, float],
) -> Iterator[tuple]:
    """For each CHUNK_LINES pairs, `samples` times: the sampled sides' text (the best
    segmentation decoded; [] for a side not sampled) with the alphas, as encode_chunk takes it."""
    for start in range(0, len(train), CHUNK_LINES):
        stop = min(start + CHUNK_LINES, len(train))
        text = []
        for side, tokenizer, array in zip(
            SIDES, (tokenizers.src, tokenizers.tgt), (train.src, train.tgt), strict=True
        ):
            ids = [array[i].tolist() for i in range(start, stop)] if side in sides else []
            text.append(tokenizer.decode(ids) if ids else [])
        for _ in range(samples):
            yield text[0], text[1], alphas


def capped(
    tokens: np.ndarray, lengths: np.ndarray, best: TokenArray, start: int, limit: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """A chunk's samples (sentences start, start + 1, ... of `best`) with each one longer than
    `limit` replaced by its best segmentation; how many were."""
    long = np.flatnonzero(lengths > limit)
    if not len(long):
        return tokens, lengths, 0
    ends = np.cumsum(lengths)
    sentences = np.split(tokens, ends[:-1])
    lengths = lengths.copy()
    for i in long:
        sentences[i] = np.asarray(best[start + int(i)], dtype=tokens.dtype)
        lengths[i] = len(sentences[i])
    return np.concatenate(sentences), lengths, len(long)
