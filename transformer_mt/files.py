"""Files that a killed process can never leave half-written: write beside, then rename."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PARTIAL_SUFFIX = ".tmp"
"""Temporary files are `.{name}.tmp` beside their target; `remove_partial_writes` finds them."""


@contextmanager
def replacing(path: Path, *, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block succeeds, rename it over `path`.

    The temporary file is removed if the block fails. durable: fsync the file before the rename
    (checkpoints: a power cut must not leave a renamed but empty file)."""
    temporary = path.with_name(f".{path.name}{PARTIAL_SUFFIX}")
    try:
        yield temporary
        if durable:
            with temporary.open("rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_text_atomically(path: Path, text: str) -> None:
    with replacing(path) as temporary:
        temporary.write_text(text, encoding="utf-8")


def copy_atomically(source: Path, target: Path) -> None:
    with replacing(target) as temporary:
        shutil.copyfile(source, temporary)


def link_atomically(source: Path, target: Path) -> None:
    """Make `target` the same file as `source` (a hard link, or a copy where links are not
    supported), so that a file is written once however many names it has."""
    with replacing(target) as temporary:
        temporary.unlink(missing_ok=True)
        try:
            os.link(source, temporary)
        except OSError:
            shutil.copyfile(source, temporary)


def remove_partial_writes(folder: Path) -> list[Path]:
    """Delete the temporary files of writes that a killed process never finished."""
    partial = sorted(folder.glob(f".*{PARTIAL_SUFFIX}"))
    for path in partial:
        path.unlink(missing_ok=True)
    return partial
