"""Where torch.compile keeps what it compiled, and what a failure of it means for the user.

A compile cache is code: torch unpickles its files, imports its Python files and loads its
shared libraries, so it is never read from the run folder, which is copied, shared and
downloaded (an older version kept it there as `compile-cache/`: a pickle planted in it ran when
the run resumed). It is kept in the user's cache folder, `$XDG_CACHE_HOME/transformer_mt/compile`
(`~/.cache/...`), in a folder only the user can enter (mode 0700: nobody else can put a file
anywhere below it), one folder per setting that torch's own keys leave out: the torch, CUDA and
cuDNN versions, the device, and the attention kernels and precision of the execution policy (torch
2.13's keys have no SDPA state: a resume with other `trainer.sdpa_backends` must not take the old
kernels). Runs with the same settings share it, as torch's own default cache is shared. Every
rank of a run uses it (torch's default, in the shared temp folder, is never read). A cache folder
that another user owns or can write to, or that holds an entry of another user's or one that
others may write, is not used; nor is one that cannot be written (a read-only or full disk): the
run then compiles into a private folder for this process alone, says so in one line, and removes
it when the run ends. TORCHINDUCTOR_CACHE_DIR, where the user sets it, is checked the same way.
Inductor's precompiled headers are kept in the folder in use too: torch keeps them in its default
folder in the shared temp folder, whatever TORCHINDUCTOR_CACHE_DIR says, and compiles in a header
it finds there (Dynamo's opt-in cache of compiled frames, whose folder is fixed there as well, is
turned off).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch._dynamo import config as dynamo_config
from torch._inductor import config as inductor_config
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from transformer_mt.errors import TransformerMTError
from transformer_mt.execution import ExecutionPolicy

log = logging.getLogger(__name__)

CACHE_SETTING = "TORCHINDUCTOR_CACHE_DIR"
SET_HERE: set[str] = set()
"""The folders this process put into CACHE_SETTING (a later start in the process chooses again)."""
PRIVATE_HERE: set[Path] = set()
"""The private folders this process made for itself (usable_folder's fallback), removed when the
run that made them ends (remove_private_folder)."""
ENTRIES = ("fxgraph", "aotautograd")
"""The cache's folders of pickled entries, each written whole by torch (to a hidden temporary file,
renamed when complete)."""
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
HEADER_NAMES = ("_HEADER_DIR", "_HEADER_LOCK_DIR", "_precompile_header")
"""Where torch 2.13's Inductor keeps its precompiled headers (torch._inductor.codecache)."""


def cache_root() -> Path:
    """$XDG_CACHE_HOME/transformer_mt/compile, or ~/.cache/transformer_mt/compile."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "transformer_mt" / "compile"


def cache_key(policy: ExecutionPolicy) -> str:
    """The folder name of the settings torch's cache keys leave out: readable, then hashed."""
    device = policy.device
    settings = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "device": device.type,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "attention": None if policy.attention is None else [a.value for a in policy.attention],
        "precision": str(policy.dtype),
    }
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return f"torch-{torch.__version__.split('+')[0]}-{device.type}-{digest}"


def use_compile_cache(policy: ExecutionPolicy, old: Path | None) -> Path:
    """Point torch.compile's cache (CACHE_SETTING) at the folder for this policy's settings
    (the module's docstring), or at the user's own where it passes the same checks; the folder in
    use, logged with what it holds. Every rank calls it, before its first compile. `old`: where an
    older version kept the run's cache, named and never read (None: not named)."""
    if old is not None and old.is_dir():
        log.warning(
            "%s is not read: a compile cache is code that torch runs, so it is kept in a folder "
            "only you can write (%s); delete it, and never copy or share it",
            old,
            cache_root(),
        )
    chosen = os.environ.get(CACHE_SETTING)
    if chosen is not None and (chosen in SET_HERE or Path(chosen) == Path(default_cache_dir())):
        chosen = None  # torch writes its default into the variable when it first uses it
    if chosen is not None:
        named, whose = f"{CACHE_SETTING}={chosen}", f"set by {CACHE_SETTING}"
        in_use, whose = usable_folder(Path(chosen), None, named=named, whose=whose)
    else:
        root = cache_root()
        named, whose = f"torch.compile's cache {root}", "yours alone, for these settings"
        in_use, whose = usable_folder(root, cache_key(policy), named=named, whose=whose)
    if chosen is None or in_use != Path(chosen):
        os.environ[CACHE_SETTING] = str(in_use)
        SET_HERE.add(str(in_use))
    keep_precompiled_headers_in(in_use)
    # Dynamo's own cache of compiled frames (opt-in: TORCH_CACHING_PRECOMPILE=1) is fixed in
    # torch's default folder, in the shared temp folder, when torch._dynamo is imported.
    dynamo_config.caching_precompile = False
    one_line_for_a_full_disk(in_use)
    files = sum(1 for path in in_use.rglob("*") if path.is_file())
    log.info("torch.compile's cache: %s (%s; %d files from earlier runs)", in_use, whose, files)
    return in_use


def keep_precompiled_headers_in(cache: Path) -> None:
    """Inductor's precompiled headers (on by default for CPU kernels: one of about 155 MB per
    compiler and flags, which shortens a first compile: benchmarks/bench_compile_headers.py)
    kept in cache/precompiled_headers. Torch fixes their folder in its default folder in the shared
    temp folder when it is imported (codecache._HEADER_DIR), whatever CACHE_SETTING says, and
    compiles in a header it finds there. A torch without those names gets them turned off."""
    from torch._inductor import codecache

    if not all(hasattr(codecache, name) for name in HEADER_NAMES):
        inductor_config.cpp_cache_precompile_headers = False
        return
    headers = cache / "precompiled_headers"
    codecache._HEADER_DIR = str(headers)
    codecache._HEADER_LOCK_DIR = str(headers / "locks")
    codecache._precompile_header.cache_clear()  # a header of this process's, made elsewhere


def usable_folder(top: Path, key: str | None, *, named: str, whose: str) -> tuple[Path, str]:
    """top/key (top itself where key is None), made private (top) and checked: no entry of
    another user's or that others may write (`unsafe`, `unsafe_inside`), writable; with `whose`.
    Else a private folder for this process alone, with a warning naming the folder (as `named`)
    and why it is not used."""
    folder = top if key is None else top / key
    try:
        why_not = unsafe(private_folder(top))
        if why_not is None:
            folder.mkdir(exist_ok=True)
            why_not = unsafe_inside(folder)
        if why_not is None:
            with tempfile.TemporaryFile(dir=folder):  # a read-only or full disk fails here
                pass
            remove_empty_entries(folder)
            return folder, whose
    except OSError as error:
        why_not = f"it cannot be written ({error.strerror})"
    private = Path(tempfile.mkdtemp(prefix="transformer_mt-compile-"))
    PRIVATE_HERE.add(private)
    log.warning(
        "%s is not used: %s; this run compiles into %s, for this process alone",
        named,
        why_not,
        private,
    )
    return private, "this process's alone"


def private_folder(folder: Path) -> Path:
    """`folder`, made if missing with mode 0700 (its parents as the user's umask makes them)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def unsafe(folder: Path) -> str | None:
    """Why someone else could put code into `folder` (it is theirs, or they may write to it),
    or None. A folder of ours that others may only read is closed to them here."""
    status = folder.stat()
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid():
        return f"it is not a folder of yours (owner uid {status.st_uid})"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "others may write to it, so it may hold code that is not yours: delete it"
    if status.st_mode & 0o077:
        folder.chmod(0o700)
    return None


def unsafe_inside(folder: Path) -> str | None:
    """Why an entry of `folder`'s tree (itself included; links not followed) may hold someone
    else's code: it is another user's, or anyone may write to it; or None. The private folder
    above keeps others out now, but not what they put in before it was closed (a folder opened
    to them, then tightened; a copy restored from elsewhere). Group-writable folders pass:
    torch makes its folders as the umask says (0775 under the common umask 002)."""
    for path in tree(folder):
        try:
            status = path.lstat()
        except FileNotFoundError:  # another run's temporary file, renamed since
            continue
        if status.st_uid != os.getuid():
            return f"{path} is not yours (owner uid {status.st_uid}): delete {folder}"
        if status.st_mode & stat.S_IWOTH and not stat.S_ISLNK(status.st_mode):
            return f"anyone may write to {path}, so it may hold code that is not yours: delete it"
    return None


def tree(folder: Path) -> Iterator[Path]:
    """`folder` and every entry below it, without following links."""
    yield folder
    for parent, folders, files in os.walk(folder):
        for name in [*folders, *files]:
            yield Path(parent, name)


def remove_empty_entries(folder: Path) -> None:
    """Remove the empty files among the cache's pickled entries (ENTRIES). Torch writes each whole,
    so an empty one is damage (a full disk, a crash), which torch would read with a warning and a
    traceback each; its hidden temporary files may be another run's, being written."""
    for kind in ENTRIES:
        for path in (folder / kind).rglob("*"):
            if path.name.startswith("."):
                continue
            with contextlib.suppress(FileNotFoundError):  # removed since, by another run
                status = path.lstat()
                if stat.S_ISREG(status.st_mode) and status.st_size == 0:
                    path.unlink()


def remove_private_folder(folder: Path | None) -> None:
    """At the end of the run that made it: remove `folder` where it is a private folder of this
    process (usable_folder's fallback: its kernels are loaded by now), and no longer point torch
    at it."""
    if folder not in PRIVATE_HERE:
        return
    PRIVATE_HERE.discard(folder)
    shutil.rmtree(folder, ignore_errors=True)
    if os.environ.get(CACHE_SETTING) == str(folder):
        del os.environ[CACHE_SETTING]
        SET_HERE.discard(str(folder))


def innermost(error: BaseException) -> BaseException:
    """What a compile failure wraps: torch.compile's backend errors wrap their cause."""
    while getattr(error, "inner_exception", None) is not None:
        error = error.inner_exception
    return error


def out_of_space(error: BaseException | str) -> bool:
    """Whether `error` says a disk is full: an OSError, or a message (a CppCompileError holds what
    the compiler printed; some of torch's warnings name the error in their text)."""
    if isinstance(error, OSError) and error.errno in FULL_DISK:
        return True
    return any(os.strerror(number) in str(error) for number in FULL_DISK)


def space_left(cache: Path | None) -> str:
    """The space left where torch.compile writes: its cache, and the temp folder (the compiler's
    temporary files)."""
    places = [("the temp folder", Path(tempfile.gettempdir()))]
    if cache is not None:
        places.insert(0, ("its cache", cache))

    def free(folder: Path) -> str:
        try:
            return f"{shutil.disk_usage(folder).free / 2**20:,.0f} MiB free"
        except OSError as error:
            return f"unreadable ({error.strerror})"

    return ", ".join(f"{name} {folder}: {free(folder)}" for name, folder in places)


class FullDiskWarnings(logging.Filter):
    """Torch's warnings of a full disk while it compiles, each with its traceback (over a thousand
    lines for one full cache), as one line of ours, said once: a compile that cannot go on fails
    with a line of its own (named_compile_failure), and one that goes on saves less."""

    def __init__(self, cache: Path):
        super().__init__()
        self.cache, self.said = cache, False

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not out_of_space(record.getMessage() if error is None else innermost(error)):
            return True
        if not self.said:
            self.said = True
            log.warning(
                "torch.compile is short of disk space: %s; it saves less of what it compiles "
                "(free space there; torch's warnings of it are left out)",
                space_left(self.cache),
            )
        return False


def one_line_for_a_full_disk(cache: Path) -> None:
    """Put a FullDiskWarnings on each of torch's log handlers (its loggers log through their own,
    not the root's), in place of an earlier one."""
    warnings = FullDiskWarnings(cache)
    torch_loggers = [
        logger
        for name, logger in list(logging.Logger.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and (name == "torch" or name.startswith("torch."))
    ]
    for logger in torch_loggers:
        for handler in logger.handlers:
            for earlier in [f for f in handler.filters if isinstance(f, FullDiskWarnings)]:
                handler.removeFilter(earlier)
            handler.addFilter(warnings)


def named_compile_failure(error: BaseException, cache: Path | None) -> TransformerMTError | None:
    """The one line for torch.compile's failure `error` (its backend's: a compiler error, a
    damaged or unwritable cache, a full disk), or None when `error` is not one."""
    from torch._dynamo.exc import BackendCompilerFailed

    if not isinstance(error, BackendCompilerFailed):
        return None
    cause = innermost(error)
    said = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    what = f"{type(cause).__name__}: {said}" if said else type(cause).__name__
    ending = "or train without it (trainer.compile=false); the checkpoints so far are intact"
    if out_of_space(cause):
        return TransformerMTError(
            f"torch.compile ran out of disk space ({what}): {space_left(cache)}; free space "
            f"where it is short (TMPDIR names another temp folder) and rerun, {ending}"
        )
    where = f" (its cache: {cache})" if cache is not None else ""
    advice = f"delete {cache} to compile afresh and rerun" if cache is not None else "rerun"
    return TransformerMTError(f"torch.compile failed{where}: {what}; {advice}, {ending}")
