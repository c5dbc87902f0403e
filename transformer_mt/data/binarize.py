"""Encode cleaned text files into a token store with several worker processes, in bounded memory.

The parent reads both text files in chunks, keeps at most two chunks per worker in flight, and
appends each encoded chunk (in corpus order) to the store; memory does not grow with the corpus.
A worker that dies (the OOM killer's SIGKILL) ends the encoding with a DataError at once:
concurrent.futures notices a lost process, where multiprocessing.Pool waits forever
(cpython#96062).
"""

from __future__ import annotations

import itertools
import multiprocessing
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from transformer_mt.data.clean import length_filter
from transformer_mt.data.store import TokenArrayWriter, token_dtype
from transformer_mt.data.tokenizer import Tokenizer, Tokenizers
from transformer_mt.errors import DataError

CHUNK_LINES = 20_000
_worker_tokenizers: tuple[Tokenizer, Tokenizer] | None = None


def load_worker_tokenizers(src_model: str, tgt_model: str) -> None:
    """A worker's setup: the tokenizers that encode_chunk uses."""
    global _worker_tokenizers
    _worker_tokenizers = (Tokenizer(src_model), Tokenizer(tgt_model))


def _flatten(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(s) for s in ids), dtype=np.int64, count=len(ids))
    tokens = np.fromiter(
        itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum())
    )
    return tokens, lengths


def encode_chunk(chunk: tuple) -> tuple[np.ndarray, ...]:
    """(src lines, tgt lines[, (src alpha, tgt alpha)]) -> src tokens, src lengths, tgt tokens,
    tgt lengths (flat arrays); a side's alpha > 0 samples its segmentations (Tokenizer.encode)."""
    assert _worker_tokenizers is not None, "worker started without load_worker_tokenizers"
    src, tgt, *rest = chunk
    src_alpha, tgt_alpha = rest[0] if rest else (0.0, 0.0)
    src_tokenizer, tgt_tokenizer = _worker_tokenizers
    return (
        *_flatten(src_tokenizer.encode(src, alpha=src_alpha)),
        *_flatten(tgt_tokenizer.encode(tgt, alpha=tgt_alpha)),
    )


def read_chunks(
    src_path: Path, tgt_path: Path, lines: int = CHUNK_LINES
) -> Iterator[tuple[list[str], list[str]]]:
    with open(src_path, encoding="utf-8") as src, open(tgt_path, encoding="utf-8") as tgt:
        while True:
            src_lines = [line.rstrip("\n") for line in itertools.islice(src, lines)]
            tgt_lines = [line.rstrip("\n") for line in itertools.islice(tgt, lines)]
            if len(src_lines) != len(tgt_lines):
                raise DataError(f"{src_path} and {tgt_path} differ in length")
            if not src_lines:
                return
            yield src_lines, tgt_lines


def select(
    tokens: np.ndarray, lengths: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The tokens and lengths of the kept sentences."""
    return tokens[np.repeat(keep, lengths)], lengths[keep]


def binarize(
    src_path: Path,
    tgt_path: Path,
    out_prefix: Path,
    tokenizers: Tokenizers,
    *,
    max_tokens: int,
    max_ratio: float,
    dropped: Counter,
    workers: int,
    chunk_lines: int = CHUNK_LINES,
    worker_setup: Callable[[str, str], None] = load_worker_tokenizers,
) -> int:
    """Encode two aligned text files into `{out_prefix}.src.*` / `.tgt.*`; return pairs kept.

    worker_setup runs once in each process with the two model paths (a test passes one that
    also makes its worker die)."""
    dtype = token_dtype(max(tokenizers.src.vocab_size, tokenizers.tgt.vocab_size))
    with (
        TokenArrayWriter(Path(f"{out_prefix}.src"), dtype) as src_out,
        TokenArrayWriter(Path(f"{out_prefix}.tgt"), dtype) as tgt_out,
    ):
        chunks = encoded_chunks(
            read_chunks(src_path, tgt_path, chunk_lines),
            (str(tokenizers.src.path), str(tokenizers.tgt.path)),
            workers,
            worker_setup,
        )
        for src_tokens, src_lengths, tgt_tokens, tgt_lengths in chunks:
            keep = length_filter(
                src_lengths,
                tgt_lengths,
                max_tokens=max_tokens,
                max_ratio=max_ratio,
                dropped=dropped,
            )
            src_out.append(*select(src_tokens, src_lengths, keep))
            tgt_out.append(*select(tgt_tokens, tgt_lengths, keep))
    return src_out.count


def encoded_chunks(
    chunks: Iterator[tuple],
    models: tuple[str, str],
    workers: int,
    worker_setup: Callable[[str, str], None] = load_worker_tokenizers,
) -> Iterator[tuple]:
    """Encoded chunks in order; with workers > 1, at most 2 * workers chunks in flight."""
    if workers <= 1:
        worker_setup(*models)
        yield from map(encode_chunk, chunks)
        return
    executor = ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),  # no fork of a parent holding threads
        initializer=worker_setup,
        initargs=models,
    )
    pending: deque = deque()
    try:
        for chunk in chunks:
            pending.append(executor.submit(encode_chunk, chunk))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool as error:
        raise DataError(
            f"an encoding worker process died ({str(error).rstrip('.')}): out of memory? Set "
            f"data.num_workers below {workers}, or free memory, and rerun"
        ) from None
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
