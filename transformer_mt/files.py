"""Files and folders that a killed process can never leave half-written: write beside, then
rename; and folders replaced only when they are ours to replace."""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from transformer_mt.errors import TransformerMTError

PARTIAL_SUFFIX = ".tmp"
"""Temporary files are `.{name}.{random}.tmp` beside their target (a name of their own, so two
writers of one file never share one); `remove_partial_writes` finds them."""


def written_path(path: Path) -> Path:
    """The file that writing `path` writes: a symbolic link's target (followed to its end, even
    where that does not exist yet), so that the link stays a link; `path` itself otherwise."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


@contextmanager
def replacing(path: Path, *, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `path` (beside a symbolic link's target: `written_path`);
    when the block succeeds, rename it over `path`. A rename replaces what it names, so a link
    renamed over would become a plain file and its target keep the old content.

    The temporary file is removed if the block fails. durable: fsync the file before the rename
    and the folder after it (checkpoints: a power cut must leave the old file or the whole new
    one, never a renamed but empty file)."""
    path = written_path(path)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}")
    try:
        yield temporary
        if durable:
            with temporary.open("rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(temporary, path)
        if durable:
            fsync_path(path.parent)
    finally:
        temporary.unlink(missing_ok=True)


class NotWritable(TransformerMTError):
    """A command's output cannot be written where it would go: found before the work."""


def check_writable(path: Path, what: str) -> None:
    """NotWritable, one line naming `what` (the key or file) and the folder, unless `path` can be
    written as `replacing` and `replacing_folder` write it: a new entry in its folder (or, for a
    folder still to be made, in the nearest one that exists), renamed over it. Checked before
    the work, so that a read-only run folder costs no decoding. os.access answers for the
    process's user and the mount: root may write where the mode says no, but not on a read-only
    file system. What it cannot foresee (a network file system's own rules) fails when written,
    in one line too (cli.py)."""
    folder = written_path(path).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if os.access(folder, os.W_OK | os.X_OK):
        return
    read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    why = "is on a read-only file system" if read_only else "may not be written by this user"
    raise NotWritable(
        f"{what}: {path} cannot be written: {folder} {why}; nothing was written (name a "
        "writable place, or copy the run folder to one)"
    )


def fsync_path(path: Path) -> None:
    """Flush a file's contents, or a folder's entries (a rename or a new file in it), to the
    disk. A folder that cannot be opened or synced (Windows, some network file systems) is let
    be: the rename stands regardless."""
    is_folder = path.is_dir()
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        if is_folder:
            return
        raise
    try:
        os.fsync(descriptor)
    except OSError:
        if not is_folder:
            raise
    finally:
        os.close(descriptor)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_text_atomically(path: Path, text: str, *, durable: bool = False) -> None:
    with replacing(path, durable=durable) as temporary:
        temporary.write_text(text, encoding="utf-8")


def copy_atomically(source: Path, target: Path) -> None:
    with replacing(target, durable=True) as temporary:
        shutil.copyfile(source, temporary)


def link_atomically(source: Path, target: Path) -> None:
    """Make `target` the same file as `source` (a hard link, or a copy where links are not
    supported), so that a file is written once however many names it has."""
    with replacing(target, durable=True) as temporary:
        try:
            os.link(source, temporary)
        except OSError:
            shutil.copyfile(source, temporary)


def remove_partial_writes(folder: Path, owned: Callable[[str], bool] = lambda name: True):
    """Delete the temporary files of writes that a killed process never finished, of the targets
    whose name `owned` accepts (another command may be writing the others right now), but for
    those a running writer holds (`lock_while_written`: the OS releases the lock when the writer
    ends, however it ends)."""
    removed = []
    for path in sorted(folder.glob(f".*{PARTIAL_SUFFIX}")):
        if owned(target_of(path)) and remove_unless_written(path):
            removed.append(path)
    return removed


def lock_while_written(handle) -> None:
    """Mark an open temporary file as being written, for as long as this process holds it open:
    `remove_partial_writes` then leaves it to its writer (a command without a run folder's lock,
    tmt-translate, may meet another writing the same output)."""
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def remove_unless_written(path: Path) -> bool:
    """Delete the temporary `path` unless a running writer holds it (`lock_while_written`);
    whether it was deleted."""
    try:
        with open(path, "rb") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            path.unlink(missing_ok=True)  # while locked: no writer takes it in between
    except FileNotFoundError:  # removed meanwhile (renamed into place, or by another cleaner)
        return False
    return True


def target_of(partial: Path) -> str:
    """The name of the file a temporary `.NAME.RANDOM.tmp` (or `.NAME.tmp`) was to become."""
    name = partial.name[1 : -len(PARTIAL_SUFFIX)]
    stem, dot, tag = name.rpartition(".")
    is_tag = dot and len(tag) == 8 and all(c in "0123456789abcdef" for c in tag)
    return stem if is_tag else name


class NotOursToReplace(TransformerMTError):
    """A folder would be replaced that this program did not write (or that holds more)."""


def check_replaceable(folder: Path, *, marker: str, what: str) -> Path:
    """`folder` as an absolute path, if it does not exist or holds `marker`; NotOursToReplace
    otherwise (see replacing_folder)."""
    folder = Path(os.path.abspath(folder))  # '.' and '..' resolved, as the renames will see them
    if folder.exists() and not (folder.is_dir() and (folder / marker).is_file()):
        raise NotOursToReplace(
            f"{folder} exists and is not {what} (it has no {marker}): it is left as it is; "
            "name a new folder, or remove this one yourself"
        )
    return folder


@contextmanager
def replacing_folder(folder: Path, *, marker: str, what: str) -> Iterator[Path]:
    """A new, empty folder beside `folder` to write into; when the block succeeds it takes
    `folder`'s place, and the folder it replaces (if any) is removed after the swap.

    `folder` is replaced only if it does not exist or holds the file `marker` (which the block
    must write: it says that the folder is `what`, ours to replace); anything else is refused
    before anything is written, so that no path a user names is ever deleted. A block that fails
    leaves the previous folder as it was; a kill between the two renames leaves it beside, as
    `.NAME.old-*`."""
    folder = check_replaceable(folder, marker=marker, what=what)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tag = secrets.token_hex(4)
    temporary = folder.with_name(f".{folder.name}.partial-{tag}")
    old = folder.with_name(f".{folder.name}.old-{tag}")
    temporary.mkdir()
    try:
        yield temporary
        if not (temporary / marker).is_file():
            raise AssertionError(f"the block did not write {marker}")  # a bug of ours
        if folder.exists():
            os.replace(folder, old)
        try:
            os.replace(temporary, folder)
        except BaseException:
            if old.exists():
                os.replace(old, folder)  # the previous folder back in its place
            raise
        fsync_path(folder.parent)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
