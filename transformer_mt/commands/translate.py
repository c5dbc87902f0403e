"""tmt-translate: lines of stdin or a file to translations (or n-best lists) on stdout or in a
file.

Typed at a terminal, each line is translated as soon as it is entered. From a file or a pipe, the
input is read in chunks of CHUNK_LINES lines, which the Translator sorts by length and batches by
decode.batch_tokens; the output keeps the input's order and is flushed after each chunk, so
memory stays bounded on a file of any length. output= and attention= files are written beside
their targets and renamed into place once every line is translated: an input that fails
halfway (a line that is not UTF-8), a full disk or a stop signal (SIGTERM, SIGINT, SIGHUP:
`Stopped`, raised where the work is, so that the temporary files are removed on the way out)
leaves the previous file as it was, and nothing beside it. A temporary that a kill no handler
sees (SIGKILL, a power cut) left is removed by the next tmt-translate writing the same file."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import stat
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO

from transformer_mt.config import TranslateJob
from transformer_mt.decode.alignment import pharaoh
from transformer_mt.decode.loading import load_translator
from transformer_mt.decode.translator import Translator
from transformer_mt.errors import ConfigError, Stopped, TransformerMTError
from transformer_mt.files import (
    check_writable,
    lock_while_written,
    remove_partial_writes,
    replacing,
    written_path,
)

log = logging.getLogger(__name__)

CHUNK_LINES = 10_000
ATTENTION_CHUNK_LINES = 100
"""With attention=FILE or alignment=FILE, a chunk's attention maps are held until written (or
turned into alignments): (T+1) x (S+1) floats a line, about 40k for 200-piece sentences, so
chunks are kept small."""


def translate(job: TranslateJob) -> None:
    job.validate()  # before the model loads
    outputs = {"output": job.output, "attention": job.attention, "alignment": job.alignment}
    check_distinct_files({"input": job.input, **outputs}, reads_stdin=job.input is None)
    check_output_folders(outputs)  # before anything is written
    translator = load_translator(
        job.run_dir, job.checkpoint, decode=job.decode, device=job.device, weights=job.weights
    )
    alignment_layer = None
    if job.alignment is not None:
        alignment_layer = translator.alignment_layer(job.alignment_layer)
    with stopped_by_signals(), ExitStack() as files:
        if job.input is None:
            source, name = sys.stdin.buffer, "<stdin>"
        else:
            source, name = files.enter_context(open_input(job.input)), job.input
        if job.output is None:
            sys.stdout.reconfigure(encoding="utf-8")
            target = sys.stdout
        else:
            target = files.enter_context(written_when_complete(Path(job.output)))
        attention = alignment = None
        if job.attention is not None:
            attention = files.enter_context(written_when_complete(Path(job.attention)))
        if job.alignment is not None:
            alignment = files.enter_context(written_when_complete(Path(job.alignment)))
        interactive = job.input is None and sys.stdin.isatty()
        maps = attention is not None or alignment is not None
        translate_stream(
            translator,
            source,
            name,
            target,
            1 if interactive else ATTENTION_CHUNK_LINES if maps else CHUNK_LINES,
            attention=attention,
            attention_layer=job.attention_layer,
            alignment=alignment,
            alignment_layer=alignment_layer,
            input_prefixes=job.input_prefixes,
        )


def translate_stream(
    translator: Translator,
    source: BinaryIO,
    name: str,
    target: TextIO,
    chunk_lines: int,
    *,
    attention: TextIO | None = None,
    attention_layer: int = -1,
    alignment: TextIO | None = None,
    alignment_layer: int | None = None,
    input_prefixes: bool = False,
) -> None:
    """Translations of `source`'s lines, one per line, flushed after every `chunk_lines` lines,
    with the translator's decode settings. With decode.nbest > 1, n-best lists in the format
    Moses' and Marian's rerankers read: 'line number (from 0) ||| translation ||| F0= score |||
    score', best first. With an `attention` file, a JSON line per input line (see
    TranslateJob.attention); with an `alignment` file, a line of `i-j` pairs per input line
    (TranslateJob.alignment), from decoder layer `alignment_layer` (Translator.alignment_layer).
    input_prefixes: each line is 'source<TAB>target prefix' (`source_and_prefix`)."""
    number = 0
    layer = None if attention is None else attention_layer
    aligned = None if alignment is None else alignment_layer
    for lines in line_batches(source, name, chunk_lines):
        prefixes = None
        if input_prefixes:
            pairs = [source_and_prefix(line) for line in lines]
            lines, prefixes = [s for s, _ in pairs], [p for _, p in pairs]
        found = translator.translate_nbest(
            lines, attention=layer, alignment=aligned, prefixes=prefixes
        )
        for nbest in found:
            if nbest[0].unmet_terms:
                log.warning(
                    "%s:%d: translated without its target terms: no hypothesis met them all "
                    "within the length limit",
                    name,
                    number + 1,
                )
            if translator.decode.nbest > 1:
                for entry in nbest:
                    score = f"{entry.score:.4f}"
                    target.write(f"{number} ||| {entry.text} ||| F0= {score} ||| {score}\n")
            else:
                target.write(nbest[0].text + "\n")
            if attention is not None:
                record = {"line": number, "weights": None}
                if nbest[0].attention is not None:
                    record = {"line": number, **dataclasses.asdict(nbest[0].attention)}
                attention.write(json.dumps(record, ensure_ascii=False) + "\n")
            if alignment is not None:
                alignment.write(pharaoh(nbest[0].alignment or []) + "\n")
            number += 1
        for written in (target, attention, alignment):
            if written is not None:
                written.flush()


def source_and_prefix(line: str) -> tuple[str, str]:
    """A line of input_prefixes=true: (source, target prefix), split at its last tab; a line
    without a tab is a source without a prefix."""
    source, tab, prefix = line.rpartition("\t")
    return (source, prefix) if tab else (line, "")


@contextmanager
def written_when_complete(path: Path) -> Iterator[TextIO]:
    """A text file to write `path` with: a temporary file beside it, renamed over it when the
    block succeeds and removed when it fails (files.replacing). A target that is not a regular
    file (/dev/stdout, a named pipe) is written as it is: it cannot be replaced. Temporaries of
    `path` that an earlier writer left when it was killed are removed first (their writer's lock
    is gone: files.remove_partial_writes)."""
    if path.exists() and not path.is_file():
        with open(path, "w", encoding="utf-8") as handle:
            yield handle
        return
    target = written_path(path)
    stale = remove_partial_writes(target.parent, lambda name: name == target.name)
    if stale:
        log.info("removed %d temporary file(s) of %s that a killed writer left", len(stale), path)
    with replacing(path) as temporary, open(temporary, "w", encoding="utf-8") as handle:
        lock_while_written(handle)
        yield handle


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def raise_stopped(signum: int, _frame) -> None:
    raise Stopped(signum)


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP raise `Stopped` in the block, so that the files it writes
    remove their temporaries on the way out (their default would end the process at once,
    leaving them for good); the handlers before it come back after."""
    previous = {number: signal.signal(number, raise_stopped) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def check_distinct_files(files: dict[str, str | None], *, reads_stdin: bool) -> None:
    """ConfigError when two of `files` (by config key; inputs first, None: not given) name one
    file (also through links), or, where the command reads standard input, when one is the file
    standard input reads (`output=in.txt < in.txt`): opening an output truncates it, which would
    destroy the input before it is read."""
    named = [(key, path) for key, path in files.items() if path is not None]
    for index, (key, path) in enumerate(named):
        for earlier_key, earlier in named[:index]:
            if same_file(Path(earlier), Path(path)):
                raise ConfigError(
                    f"config key '{key}': {key}={path} is the same file as {earlier_key}="
                    f"{earlier}: writing it would destroy {earlier_key} first; name another file"
                )
        if reads_stdin and is_standard_input(Path(path)):
            raise ConfigError(
                f"config key '{key}': {path} is the file standard input reads: writing it "
                "would destroy the input first; name another file"
            )


def check_output_folders(outputs: dict[str, str | None]) -> None:
    """ConfigError or files.NotWritable, naming the key, unless each of `outputs` (by config
    key; None: not given) can be written (a folder that exists and takes new files:
    files.check_writable), before the model loads; a target that is not a regular file
    (/dev/stdout, a pipe) is written as it is."""
    for key, name in outputs.items():
        if name is None or (Path(name).exists() and not Path(name).is_file()):
            continue
        folder = written_path(Path(name)).parent
        if not folder.is_dir():
            raise ConfigError(f"config key '{key}': the folder of {name}, {folder}, does not exist")
        check_writable(Path(name), f"config key '{key}'")


def same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def is_standard_input(path: Path) -> bool:
    """Whether `path` is the regular file standard input reads (the same device and inode; a
    terminal or a pipe is never truncated by opening an output)."""
    try:
        source, target = os.fstat(sys.stdin.fileno()), os.stat(path)
    except (OSError, ValueError):  # no standard input, or no file at `path` yet
        return False
    same = (source.st_dev, source.st_ino) == (target.st_dev, target.st_ino)
    return same and stat.S_ISREG(source.st_mode)


def open_input(path: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as error:
        raise TransformerMTError(f"input={path}: {error.strerror}") from None


def line_batches(stream: BinaryIO, name: str, size: int) -> Iterator[list[str]]:
    """Lines of a binary stream (UTF-8, split on newlines only) in batches of up to `size`."""
    batch: list[str] = []
    for number, raw in enumerate(stream, start=1):
        try:
            batch.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError:
            raise TransformerMTError(f"{name}:{number}: not valid UTF-8") from None
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
