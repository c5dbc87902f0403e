"""Corpus -> prepared folder: cleaned, tokenized with SentencePiece, binarized.

The folder is named by a hash of everything that produced it (the corpus's identity and version,
the cleaning settings, the tokenizer settings, this format's version), so it is reused when
nothing changed and rebuilt when anything did. It is built under a temporary name and renamed
when complete: an interrupted build is never mistaken for a finished one. Its files reach the
disk before the rename, and `stats.json`, written last, records each one's size and sha256, which
every open checks: a damaged folder is a one-line DataError naming the file, never a traceback.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from transformer_mt.config import DataConfig
from transformer_mt.data.binarize import CHUNK_LINES, binarize
from transformer_mt.data.clean import CHARS_PER_PIECE_BOUND, clean_text_pairs, single_line
from transformer_mt.data.sources import corpus_identity, pair_place, read_pairs, source_version
from transformer_mt.data.store import (
    ParallelTokens,
    check_files,
    damaged,
    seal_files,
)
from transformer_mt.data.tags import TagScan, tag_keys
from transformer_mt.data.tokenizer import (
    SHARED_FILE,
    SRC_FILE,
    TGT_FILE,
    Reservoir,
    Tokenizer,
    Tokenizers,
    load_tokenizers,
    train_tokenizer,
)
from transformer_mt.device import usable_cpus
from transformer_mt.errors import ConfigError, DataError
from transformer_mt.files import file_sha256, fsync_path

log = logging.getLogger(__name__)

FORMAT_VERSION = 3  # 3: SentencePiece without its own normalisation, with byte fallback
STATS_FILE = "stats.json"
BUILD_MARK, LOCK_SUFFIX = ".tmp-", ".lock"
"""A build's temporary folder is `.NAME.tmp-HOST-PID-RANDOM`, its lock file that name + .lock."""


SAMPLING_KEYS = ("src_subword_alpha", "tgt_subword_alpha", "subword_samples")
"""The data.* keys of subword regularization, which train from a folder of their own."""

VALID_TEXT = ("valid.text.src", "valid.text.tgt")
"""The valid split as read, one sentence a line: what validation BLEU translates and scores."""


@dataclass(frozen=True)
class ExtraCorpus:
    """A training corpus of data.corpora, prepared in a folder of its own."""

    name: str
    folder: Path
    train: ParallelTokens


@dataclass(frozen=True)
class PreparedData:
    """The main corpus's prepared folder (tokenizers, train, valid) and the other training
    corpora's (data.corpora), encoded with the same tokenizers."""

    tokenizers: Tokenizers
    train: ParallelTokens
    valid: ParallelTokens
    folder: Path
    extra: tuple[ExtraCorpus, ...] = ()

    def valid_text(self, count: int) -> tuple[list[str], list[str]]:
        """The first `count` sources and references of the valid split as read: not cleaned,
        normalised or length-filtered like the binarized split (validation BLEU scores raw
        references, as tmt-eval does)."""
        sides = []
        for name in VALID_TEXT:
            with open(self.folder / name, encoding="utf-8") as lines:
                sides.append([line.rstrip("\n") for line in itertools.islice(lines, count)])
        return sides[0], sides[1]


def fingerprint(cfg: DataConfig) -> str:
    """Hash of every input and setting that determines the main corpus's prepared folder. The
    other corpora (data.corpora) and the tags count where SentencePiece is trained here: its
    sample is drawn from every corpus, and each tag is a piece of its own. Weights never count:
    they decide how often a pair is trained on, not how it is prepared."""
    settings = corpus_settings(cfg)
    if cfg.spm_model is not None:  # the given model's content, not its place or training settings
        for key in ("spm_model", "vocab_size", "character_coverage", "spm_sample_sentences"):
            settings.pop(key)
        settings["spm_sha256"] = [file_sha256(path) for path in given_tokenizer_files(cfg)]
    else:
        if cfg.corpora:
            settings["corpora"] = {
                name: corpus_settings(cfg.corpus(name), splits=("train",)) for name in cfg.corpora
            }
        if cfg.tags:
            settings["tags"] = sorted(cfg.tags)
    return settings_hash(settings)


def corpus_settings(cfg: DataConfig, splits: tuple[str, ...] = ("train", "valid")) -> dict:
    """What identifies a corpus's `splits` as read and cleaned: its content (source_version),
    the settings that read and clean it, this format's version; not names, places, speed knobs,
    weights, tags or the sampling of segmentations (whose folder is its own: subword_sampling)."""
    settings = asdict(cfg)
    for key in ("name", "prepared_dir", "num_workers", "test_split", "hf_path", "dir"):
        settings.pop(key)  # names, places and speed knobs; source_version identifies the corpus
    for key in ("weight", "tag", "corpora", *SAMPLING_KEYS):
        settings.pop(key)
    settings.update(format=FORMAT_VERSION, source_version=source_version(cfg, splits))
    return settings


def settings_hash(settings: dict) -> str:
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def given_tokenizer_files(cfg: DataConfig) -> list[Path]:
    """data.spm_model's file(s): [shared] or [source, target]; ConfigError when they are missing
    or do not match data.shared_vocab."""
    path = Path(cfg.spm_model)
    if path.is_file():
        files = [path]
    elif (path / SHARED_FILE).is_file():
        files = [path / SHARED_FILE]
    elif (path / SRC_FILE).is_file() and (path / TGT_FILE).is_file():
        files = [path / SRC_FILE, path / TGT_FILE]
    else:
        raise ConfigError(
            f"data.spm_model={path}: no SentencePiece model there (a .model file, or a folder "
            f"holding {SHARED_FILE}, or {SRC_FILE} and {TGT_FILE})"
        )
    if (len(files) == 1) != cfg.shared_vocab:
        kind = "one shared model" if len(files) == 1 else "a source and a target model"
        raise ConfigError(
            f"data.spm_model={path} is {kind}, but data.shared_vocab={cfg.shared_vocab}: set "
            f"data.shared_vocab={len(files) == 1}"
        )
    return files


def load_given_tokenizers(cfg: DataConfig) -> Tokenizers:
    """data.spm_model's tokenizers, where they lie (before preparing copies them)."""
    files = [Tokenizer(path) for path in given_tokenizer_files(cfg)]
    return Tokenizers(files[0], files[-1])


def prepared_folder(cfg: DataConfig) -> Path:
    return Path(cfg.prepared_dir) / f"{cfg.name}-{fingerprint(cfg)}"


def wait_until_prepared(cfg: DataConfig) -> None:
    """Block until another process (rank 0) has finished preparing `cfg`'s main corpus."""
    wait_for_folder(prepared_folder(cfg))


def wait_for_folder(folder: Path, *, poll_seconds: float = 2.0) -> None:
    """Block until another process (rank 0) has finished building `folder` (a prepared corpus,
    or its sampled segmentations), however long that takes (downloading and preparing WMT takes
    tens of minutes): a polled file, not a collective, so no process-group timeout applies. A
    rank 0 that fails ends the job instead (torchrun stops the other ranks)."""
    ready = folder / STATS_FILE
    started = time.monotonic()
    next_report = 600.0
    while not ready.is_file():
        time.sleep(poll_seconds)
        waited = time.monotonic() - started
        if waited >= next_report:
            log.warning("still waiting for rank 0 to prepare %s (%.0f min)", folder, waited / 60)
            next_report += 600.0


def prepare(cfg: DataConfig) -> PreparedData:
    """The prepared corpus, built first if it is not there yet."""
    folder = prepared_folder(cfg)
    if (folder / STATS_FILE).is_file():
        log.info("reusing prepared data %s", folder)
    else:
        build(cfg, folder)
    return open_prepared(folder)


def open_prepared(folder: Path) -> PreparedData:
    """A prepared corpus that exists (the other ranks of a distributed run open what rank 0
    built), checked first: every file against the size and sha256 that stats.json recorded
    (folders prepared before that record existed carry none), then the token stores' structure
    and every id against its vocabulary."""
    stats = read_stats(folder)
    check_files(folder, stats.get("files", {}))
    tokenizers = load_tokenizers(folder)
    vocab_sizes = (tokenizers.src.vocab_size, tokenizers.tgt.vocab_size)
    return PreparedData(
        tokenizers,
        ParallelTokens.load(folder, "train", vocab_sizes),
        ParallelTokens.load(folder, "valid", vocab_sizes),
        folder,
    )


def read_stats(folder: Path) -> dict:
    """stats.json of a finished folder; DataError when there is none or it does not parse."""
    path = folder / STATS_FILE
    if not path.is_file():
        raise DataError(f"{folder}: prepared data not found")
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))
        record = stats.get("files", {})
        garbled = not all(
            isinstance(entry["bytes"], int) and isinstance(entry["sha256"], str)
            for entry in record.values()
        )
    except Exception as error:  # OSError, JSON, a value of the wrong type or shape
        raise damaged(path, f"unreadable ({type(error).__name__}: {error})") from error
    if garbled:
        raise damaged(path, "its record of the files' sizes and sha256 is garbled")
    return stats


def build(cfg: DataConfig, folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_builds(folder.parent)
    with build_folder(folder) as temporary:
        stats = build_into(cfg, temporary)
        publish(temporary, folder, stats)


@contextmanager
def build_folder(folder: Path) -> Iterator[Path]:
    """A new temporary folder beside `folder` to build in, removed afterwards. Its name holds
    host, PID and a random part (unique across hosts and PID namespaces sharing the file
    system); its lock file stays flock'ed until this process ends, however it ends, so the lock
    (not the PID) tells remove_abandoned_builds whether the build is alive."""
    prefix = f".{folder.name}{BUILD_MARK}{socket.gethostname()}-{os.getpid()}-"
    descriptor, name = tempfile.mkstemp(prefix=prefix, suffix=LOCK_SUFFIX, dir=folder.parent)
    lock = Path(name)
    temporary = lock.with_name(lock.name.removesuffix(LOCK_SUFFIX))
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody holds it
        except OSError as error:  # no flock here (ENOLCK): sweepers cannot take it either
            log.warning("%s: no lock (%s); a killed build stays behind", lock, error.strerror)
        temporary.mkdir()  # after the lock: a build folder whose lock is free is never live
        yield temporary
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
        lock.unlink(missing_ok=True)
        os.close(descriptor)


def remove_abandoned_builds(parent: Path) -> None:
    """Delete the temporary folders (of any corpus) of builds whose process is gone: killed
    before its cleanup ran."""
    for temporary in parent.glob(f".*{BUILD_MARK}*"):
        if temporary.is_dir() and not build_running(temporary):
            log.info("removing %s, left behind by a build that was killed", temporary)
            shutil.rmtree(temporary, ignore_errors=True)
            Path(f"{temporary}{LOCK_SUFFIX}").unlink(missing_ok=True)


def build_running(temporary: Path) -> bool:
    """Whether a process holds the lock of the build in `temporary`. Without a lock file it is
    not running: an older version's build (named by PID alone) or one whose cleanup was cut."""
    try:
        descriptor = os.open(f"{temporary}{LOCK_SUFFIX}", os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:  # not ours to open: keep it
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: its builder holds it; anything else: cannot tell
        return True
    finally:
        os.close(descriptor)  # releases the lock just taken
    return False


def publish(temporary: Path, folder: Path, stats: dict) -> None:
    """Rename the finished build to `folder`, durably: every file, then stats.json (written
    last, with every other file's size and sha256), then the folder reach the disk before the
    rename, and the rename after it. Without the fsyncs, a power cut soon after a build can
    publish a folder of empty files (ext4's delayed allocation)."""
    stats["files"] = seal_files(temporary)
    (temporary / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    fsync_path(temporary / STATS_FILE)
    fsync_path(temporary)
    try:
        os.rename(temporary, folder)
    except OSError as error:
        if (folder / STATS_FILE).is_file():  # another process finished the same folder first
            return
        raise DataError(
            f"{folder}: a folder that is no finished prepared corpus (no {STATS_FILE}) is in the "
            f"way of the new one ({error.strerror}); delete it and rerun"
        ) from error
    fsync_path(folder.parent)


def build_into(cfg: DataConfig, folder: Path) -> dict:
    """Clean, train SentencePiece, binarize train and valid into `folder`; return the statistics."""
    log.info(
        "preparing %s into %s", corpus_identity(cfg), folder.name.split(".tmp-")[0].lstrip(".")
    )
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    dropped_text: Counter = Counter()
    samples = None
    if cfg.spm_model is None:
        shared = Reservoir(cfg.spm_sample_sentences, cfg.seed)
        samples = (
            (shared, shared)
            if cfg.shared_vocab
            else (shared, Reservoir(cfg.spm_sample_sentences, cfg.seed + 1))
        )
    scan = TagScan(tag_keys(cfg))
    n_read = write_clean_train(cfg, folder, dropped_text, samples, scan)
    if samples is not None:
        for name in cfg.corpora:  # SentencePiece's sample is drawn from every corpus
            sample_corpus(cfg.corpus(name), samples, TagScan(scan.tags))
    seconds["clean"], clock = time.perf_counter() - clock, time.perf_counter()
    if samples is None:
        tokenizers = given_tokenizers(cfg, folder)
    else:
        tokenizers = train_tokenizers(cfg, samples, folder)
        del samples
    seconds["sentencepiece"], clock = time.perf_counter() - clock, time.perf_counter()
    stats: dict = {
        "source": corpus_identity(cfg),
        "shared_vocab": cfg.shared_vocab,
        "splits": {},
        "vocab_size": [tokenizers.src.vocab_size, tokenizers.tgt.vocab_size],
    }
    for split in ("train", "valid"):
        dropped = dropped_text if split == "train" else Counter()
        if split != "train":
            n_read = write_clean_text(cfg, split, folder, dropped, None, scan)
        kept = binarize_split(
            cfg, split, folder, tokenizers, dropped, small=n_read <= 4 * CHUNK_LINES
        )
        counted = {reason: count for reason, count in dropped.items() if count}
        stats["splits"][split] = {"kept": kept, "dropped": counted}
        log.info("%s: kept %d pairs; dropped %s", split, kept, counted or "none")
    write_valid_text(cfg, folder)
    stats["tag_like"] = scan.found
    seconds["binarize"] = time.perf_counter() - clock
    stats["seconds"] = {phase: round(value, 1) for phase, value in seconds.items()}
    return stats


def binarize_split(
    cfg: DataConfig,
    split: str,
    folder: Path,
    tokenizers: Tokenizers,
    dropped: Counter,
    *,
    small: bool,
) -> int:
    """Encode the split's cleaned text into the store (worker processes unless it is small)."""
    workers = 1 if small else cfg.num_workers or usable_cpus()
    text = [folder / f"{split}.clean.{side}" for side in ("src", "tgt")]
    kept = binarize(
        *text,
        folder / split,
        tokenizers,
        max_tokens=cfg.max_tokens_per_sentence,
        max_ratio=cfg.max_length_ratio,
        dropped=dropped,
        workers=workers,
        chunk_lines=CHUNK_LINES,
    )
    for path in text:
        path.unlink()
    if kept == 0:
        reasons = ", ".join(
            f"{count} pairs dropped as {reason}" for reason, count in dropped.items()
        )
        raise DataError(
            f"the {split} split of {corpus_identity(cfg)} is empty after cleaning: {reasons} "
            "(see data.max_tokens_per_sentence, data.max_length_ratio)"
        )
    return kept


def train_tokenizers(
    cfg: DataConfig, samples: tuple[Reservoir, Reservoir], folder: Path
) -> Tokenizers:
    """One SentencePiece model on both sides' sample (the paper's), or one per side; each tag a
    control piece of the source side's."""
    settings = {"vocab_size": cfg.vocab_size, "character_coverage": cfg.character_coverage}
    tags = {"control_symbols": sorted(cfg.tags)}
    if cfg.shared_vocab:
        log.info(
            "training SentencePiece (BPE, %d pieces) on %d sentences",
            cfg.vocab_size,
            len(samples[0].items),
        )
        shared = train_tokenizer(samples[0].items, folder / SHARED_FILE, **settings, **tags)
        return Tokenizers(shared, shared)
    log.info(
        "training source and target SentencePiece models (BPE, %d pieces each)", cfg.vocab_size
    )
    return Tokenizers(
        train_tokenizer(samples[0].items, folder / SRC_FILE, **settings, **tags),
        train_tokenizer(samples[1].items, folder / TGT_FILE, **settings),
    )


def given_tokenizers(cfg: DataConfig, folder: Path) -> Tokenizers:
    """data.spm_model's file(s), copied into the prepared folder under the usual names."""
    files = given_tokenizer_files(cfg)
    names = [SHARED_FILE] if len(files) == 1 else [SRC_FILE, TGT_FILE]
    for path, name in zip(files, names, strict=True):
        Tokenizer(path)  # a damaged model is named where the user put it, not as our copy
        shutil.copyfile(path, folder / name)
    log.info("encoding with the given SentencePiece model(s): %s", ", ".join(map(str, files)))
    return load_tokenizers(folder)


def write_clean_text(
    cfg: DataConfig,
    split: str,
    folder: Path,
    dropped: Counter,
    samples: tuple[Reservoir, Reservoir] | None,
    scan: TagScan,
) -> int:
    """Stream one split through the text filters into two aligned files; feed the samples; the
    scan records the strings of a tag's form (and refuses the run's tags)."""
    count = 0
    with (
        open(folder / f"{split}.clean.src", "w", encoding="utf-8") as src_out,
        open(folder / f"{split}.clean.tgt", "w", encoding="utf-8") as tgt_out,
    ):
        for src, tgt in cleaned_pairs(cfg, split, dropped, scan):
            src_out.write(single_line(src) + "\n")
            tgt_out.write(single_line(tgt) + "\n")
            if samples is not None:
                samples[0].add(src)
                samples[1].add(tgt)
            count += 1
    return count


def write_clean_train(
    cfg: DataConfig,
    folder: Path,
    dropped: Counter,
    samples: tuple[Reservoir, Reservoir] | None,
    scan: TagScan,
) -> int:
    """write_clean_text of the training split; DataError when cleaning leaves nothing of it."""
    count = write_clean_text(cfg, "train", folder, dropped, samples, scan)
    if count == 0:
        raise DataError(
            f"the training split of {corpus_identity(cfg)} is empty after cleaning "
            f"(dropped: {dict(dropped)})"
        )
    return count


def cleaned_pairs(
    cfg: DataConfig, split: str, dropped: Counter, scan: TagScan
) -> Iterator[tuple[str, str]]:
    """One split's pairs as read (scanned for tags), through the text filters."""
    return clean_text_pairs(
        scan.scanned(read_pairs(cfg, split, dropped), pair_place(cfg, split)),
        dropped,
        unicode_form=cfg.unicode_form,
        dedupe=cfg.dedupe and split == "train",
        max_chars=CHARS_PER_PIECE_BOUND * cfg.max_tokens_per_sentence,
    )


def sample_corpus(cfg: DataConfig, samples: tuple[Reservoir, Reservoir], scan: TagScan) -> None:
    """Feed a corpus's cleaned training pairs to SentencePiece's samples (the same draw as the
    main corpus's: one uniform sample of every corpus's pairs, whatever their weights)."""
    log.info("sampling %s for SentencePiece", corpus_identity(cfg))
    for src, tgt in cleaned_pairs(cfg, "train", Counter(), scan):
        samples[0].add(src)
        samples[1].add(tgt)


def write_valid_text(cfg: DataConfig, folder: Path) -> None:
    """The valid split as read (line breaks inside a sentence aside) into VALID_TEXT."""
    with (
        open(folder / VALID_TEXT[0], "w", encoding="utf-8") as src_out,
        open(folder / VALID_TEXT[1], "w", encoding="utf-8") as tgt_out,
    ):
        for src, tgt in read_pairs(cfg, "valid"):
            src_out.write(single_line(src) + "\n")
            tgt_out.write(single_line(tgt) + "\n")
