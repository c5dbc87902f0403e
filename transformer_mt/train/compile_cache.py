"""Where torch.compile keeps what it compiled, and what a failure of it means for the user.

A compile cache is code: torch unpickles its files, imports its Python files and loads its
shared libraries, so it is never read from the run folder, which is copied, shared and
downloaded (an older version kept it there as `compile-cache/`: a pickle planted in it ran when
the run resumed). It is kept in the user's cache folder, `$XDG_CACHE_HOME/transformer_mt/compile`
(`~/.cache/...`), in a folder only the user can enter (mode 0700: nobody else can put a file
anywhere below it), one folder per setting that torch's own keys leave out: the torch, CUDA and
cuDNN versions, the device, and the attention kernels and precision of the execution policy (torch
2.13's keys have no SDPA state: a resume with other `trainer.sdpa_backends` must not take the old
kernels). Runs with the same settings share it, as torch's own default cache is shared. A cache
folder that another user owns or can write to is not used; nor is one that cannot be written (a
read-only or full disk): the run then compiles into a private folder for this process alone, and
says so in one line. TORCHINDUCTOR_CACHE_DIR, where the user sets it, is used as given.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
import tempfile
from pathlib import Path

import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from transformer_mt.errors import TransformerMTError
from transformer_mt.execution import ExecutionPolicy

log = logging.getLogger(__name__)

CACHE_SETTING = "TORCHINDUCTOR_CACHE_DIR"
SET_HERE: set[str] = set()
"""The folders this process put into CACHE_SETTING (a later start in the process chooses again)."""


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


def use_compile_cache(policy: ExecutionPolicy, old: Path) -> Path:
    """Point torch.compile's cache (CACHE_SETTING) at the folder for this policy's settings
    (the module's docstring), unless the user chose one; the folder in use, logged with what it
    holds. `old`: where an older version kept the run's cache, named and never read."""
    if old.is_dir():
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
        in_use, whose = Path(chosen), f"set by {CACHE_SETTING}"
    else:
        in_use, whose = usable_folder(cache_root(), cache_key(policy))
        os.environ[CACHE_SETTING] = str(in_use)
        SET_HERE.add(str(in_use))
    files = sum(1 for path in in_use.rglob("*") if path.is_file()) if in_use.is_dir() else 0
    log.info("torch.compile's cache: %s (%s; %d files from earlier runs)", in_use, whose, files)
    return in_use


def usable_folder(root: Path, key: str) -> tuple[Path, str]:
    """root/key, made private and checked writable, with how it was chosen; else a private
    folder for this process alone, with a warning saying why."""
    try:
        why_not = unsafe(private_folder(root))
        if why_not is None:
            folder = root / key
            folder.mkdir(exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):  # a read-only or full disk fails here
                pass
            return folder, "yours alone, for these settings"
    except OSError as error:
        why_not = f"it cannot be written ({error.strerror})"
    private = Path(tempfile.mkdtemp(prefix="transformer_mt-compile-"))
    log.warning(
        "torch.compile's cache %s is not used: %s; this run compiles into %s, for this process "
        "alone",
        root,
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


def named_compile_failure(error: BaseException, cache: Path | None) -> TransformerMTError | None:
    """The one line for torch.compile's failure `error` (its backend's: a compiler error, a
    damaged or unwritable cache, a full disk), or None when `error` is not one."""
    from torch._dynamo.exc import BackendCompilerFailed

    if not isinstance(error, BackendCompilerFailed):
        return None
    cause: BaseException = error
    while getattr(cause, "inner_exception", None) is not None:
        cause = cause.inner_exception
    said = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    what = f"{type(cause).__name__}: {said}" if said else type(cause).__name__
    where = f" (its cache: {cache})" if cache is not None else ""
    if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
        advice = "free space and rerun"
    else:
        advice = f"delete {cache} to compile afresh and rerun" if cache is not None else "rerun"
    return TransformerMTError(
        f"torch.compile failed{where}: {what}; {advice}, or train without it "
        "(trainer.compile=false); the checkpoints so far are intact"
    )
