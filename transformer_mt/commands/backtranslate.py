"""tmt-backtranslate: monolingual text to a synthetic parallel corpus, in one resumable command.

The run in run_dir translates the input (text in its source language: the language that the
model to be trained translates into) chunk by chunk of `chunk_lines` lines. Each chunk's
translations are written to their own file (beside it, then renamed) as soon as they are made,
so a kill or a full disk loses at most the chunk in progress, and the same command continues
with the next one. With sampling, each chunk draws from decode.seed and its number, so a
continued corpus is the corpus of an uninterrupted command. When every chunk is done, the
corpus's two files are written (`{split}.{input language}`, the input's lines, and
`{split}.{run's target language}`, their translations) and `backtranslation.json` says which
run, checkpoint, decoding settings and input made it. A training run names the folder as a
corpus: `+data.corpora.bt={dir:OUTPUT,tag:"<BT>"}`.
"""

from __future__ import annotations

import itertools
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

from transformer_mt.commands.progress import Progress
from transformer_mt.config import BacktranslateJob, DataConfig, config_dict
from transformer_mt.data.sources import count_lines
from transformer_mt.decode.loading import load_translator
from transformer_mt.decode.translator import Translator
from transformer_mt.errors import ConfigError, DataError
from transformer_mt.files import file_sha256, replacing
from transformer_mt.run_dir import RunDir

log = logging.getLogger(__name__)

RECORD = "backtranslation.json"
CHUNKS = ".chunks"
"""The output's folder of finished chunks' translations, CHUNKS/NNNNNN.txt, until the end."""


def backtranslate(job: BacktranslateJob) -> Path:
    """Write (or continue, or find complete) the synthetic corpus of `job`; return its folder."""
    job.validate()
    data = RunDir(job.run_dir).data_config()
    languages = input_language(job, data), data.tgt_lang
    source = Path(job.input)
    if not source.is_file():
        raise ConfigError(f"config key 'input': {source}: no such file")
    output = Path(job.output)
    if output.exists() and not output.is_dir():
        raise ConfigError(f"config key 'output': {output} is a file, not a folder")
    lines = count_lines(source)
    wanted = corpus_record(job, source, languages, lines)
    done = check_output(output, wanted)
    if done:
        log.info("%s is complete already (%d lines): nothing to do", output, lines)
        return output
    translator = load_translator(
        job.run_dir, job.checkpoint, decode=job.decode, device=job.device, weights=job.weights
    )
    wanted["checkpoint"] = translator.origin
    wanted["decode"] = translator.settings_record(job.decode)  # the precision that runs
    check_output(output, wanted)  # the chunks done are of this checkpoint and precision
    chunks = output / CHUNKS
    chunks.mkdir(parents=True, exist_ok=True)
    write_record(output, wanted | {"complete": False})
    translate_chunks(translator, job, source, chunks, lines)
    empty = write_corpus(output, job.split, languages, source, chunks, lines)
    write_record(output, wanted | {"complete": True, "empty_translations": empty})
    shutil.rmtree(chunks)
    log.info("wrote %s: %d pairs, %s", output, lines, ", ".join(corpus_files(job, languages)))
    if empty:
        log.warning(
            "%d of %d translations are empty (training drops those pairs): is %s trained enough?",
            empty,
            lines,
            translator.origin["checkpoint"],
        )
    return output


def input_language(job: BacktranslateJob, data: DataConfig) -> str:
    """The input's language (input_lang, else the file's suffix), which must be the language
    the run translates from; ConfigError naming the key otherwise."""
    suffix = Path(job.input).suffix.lstrip(".")
    language = job.input_lang or suffix
    key = "input_lang" if job.input_lang else "input"
    if language != data.src_lang:
        said = f"input_lang={job.input_lang}" if job.input_lang else f"the suffix of {job.input}"
        raise ConfigError(
            f"config key '{key}': the run in {job.run_dir} translates {data.src_lang}→"
            f"{data.tgt_lang}, but the input is in {language or '(no language)'} ({said}): "
            f"back-translation needs monolingual {data.src_lang} text and the run of the reverse "
            f"direction (name the input's language with input_lang={data.src_lang} if its file "
            "has no such suffix)"
        )
    return language


def corpus_record(
    job: BacktranslateJob, source: Path, languages: tuple[str, str], lines: int
) -> dict:
    """What makes the corpus what it is: the run, the input's content, the languages, the
    chunking (with sampling, each chunk draws from its own seed); the checkpoint and the
    decoding settings as they run (with the precision auto chose) are added once the model is
    loaded."""
    return {
        "run_dir": str(Path(job.run_dir).resolve()),
        "input": str(source.resolve()),
        "decode_settings": config_dict(job.decode),  # as given; "decode": as they run
        "input_sha256": file_sha256(source),
        "lines": lines,
        "languages": {"source": languages[1], "target": languages[0]},
        "split": job.split,
        "chunk_lines": job.chunk_lines,
    }


def check_output(output: Path, wanted: dict) -> bool:
    """Whether the output holds this corpus complete already; ConfigError when it holds another
    command's (another input, run or setting: its chunks cannot be continued)."""
    path = output / RECORD
    if not path.is_file():
        if output.exists() and any(output.iterdir()):
            raise ConfigError(
                f"config key 'output': {output} is a folder that holds other files and no "
                f"{RECORD}: name a new folder"
            )
        return False
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: unreadable ({error}); delete {output} to start over") from None
    differ = [key for key in wanted if found.get(key) != wanted[key]]
    if differ:
        raise ConfigError(
            f"config key 'output': {output} holds a back-translation made with other settings "
            f"({', '.join(differ)} differ): name another folder, or delete it to start over"
        )
    return bool(found.get("complete"))


def write_record(output: Path, record: dict) -> None:
    with replacing(output / RECORD) as temporary:
        temporary.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def chunk_path(chunks: Path, number: int) -> Path:
    return chunks / f"{number:06d}.txt"


def translate_chunks(
    translator: Translator, job: BacktranslateJob, source: Path, chunks: Path, lines: int
) -> None:
    """Translate every chunk whose file is missing, each written when complete. Progress: a bar
    of sentences with their rate and the time left on a terminal, else a log line a minute."""
    total = -(-lines // job.chunk_lines)
    done = sum(chunk_path(chunks, number).is_file() for number in range(total))
    if done:
        log.info("continuing: %d of %d chunks of %d lines are done", done, total, job.chunk_lines)
    progress = Progress(lines, "back-translating", "back-translated", "sentences")
    for number, chunk in enumerate(read_chunks(source, job.chunk_lines)):
        path = chunk_path(chunks, number)
        if path.is_file():
            progress.skipped(len(chunk))
            continue
        translator.backend.reseed(job.decode.seed + number)  # a chunk's draw is its own
        texts = translator.translate(chunk)
        with replacing(path) as temporary:
            temporary.write_text("".join(text + "\n" for text in texts), encoding="utf-8")
        progress.advanced(len(chunk))
    progress.close()


def read_chunks(source: Path, size: int) -> Iterator[list[str]]:
    """The input's lines (UTF-8, without their newline) in chunks of `size`; DataError naming
    the file and line of one that is not UTF-8."""
    with open(source, "rb") as handle:
        numbered = enumerate(handle, start=1)
        while chunk := list(itertools.islice(numbered, size)):
            yield [decoded(raw, source, number) for number, raw in chunk]


def decoded(raw: bytes, source: Path, number: int) -> str:
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as error:
        raise DataError(f"{source}:{number}: not valid UTF-8 ({error.reason})") from None


def corpus_files(job: BacktranslateJob, languages: tuple[str, str]) -> list[str]:
    return [f"{job.split}.{language}" for language in languages]


def write_corpus(
    output: Path,
    split: str,
    languages: tuple[str, str],
    source: Path,
    chunks: Path,
    lines: int,
) -> int:
    """The corpus's two files: the input's lines as they are (line breaks inside a line aside)
    and the chunks' translations in order; the number of empty translations. DataError when a
    chunk is missing or short."""
    inputs = replacing(output / f"{split}.{languages[0]}")
    with inputs as temporary, open(temporary, "w", encoding="utf-8") as out:
        for chunk in read_chunks(source, 10_000):
            out.writelines(line + "\n" for line in chunk)
    written, number, empty = 0, 0, 0
    translations = replacing(output / f"{split}.{languages[1]}")
    with translations as temporary, open(temporary, "w", encoding="utf-8") as out:
        while written < lines:
            path = chunk_path(chunks, number)
            if not path.is_file():
                raise DataError(f"{path}: a chunk is missing; rerun the same command")
            text = path.read_text(encoding="utf-8")
            out.write(text)
            written += text.count("\n")
            empty += sum(1 for line in text.split("\n")[:-1] if not line.strip())
            number += 1
    if written != lines:
        raise DataError(f"{chunks}: {written} translated lines for {lines} input lines")
    return empty
