"""One writer per run folder: an exclusive lock held for the life of the command.

The lock is `flock` on a file in the folder, so the operating system releases it when the process
ends, however it ends (a SIGKILLed run does not block the next start). While held, the file
names its holder (host, PID, since when) for the message that refuses a second writer; it is
emptied again on release. A folder the lock created, that holds nothing else when it is
released (a command refused before its first write), is removed with it: a refused command
leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from pathlib import Path

from transformer_mt.errors import TransformerMTError


class RunFolderInUse(TransformerMTError):
    """Another process holds the run folder's lock."""


class RunLock:
    def __init__(self, path: Path):
        self.path = path
        self.handle = None
        self.created_folder = False

    def __enter__(self) -> RunLock:
        folder = self.path.parent
        self.created_folder = not folder.exists()
        while True:
            handle = self.locked_file()
            if is_still_at(handle, self.path):
                break
            handle.close()  # its holder removed it on release: lock the file now at the path
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        }
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder) + "\n")
        handle.flush()
        self.handle = handle
        return self

    def locked_file(self):
        """The lock file, open and locked; RunFolderInUse when another process holds it."""
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115  (held until __exit__)
        except OSError as error:  # a file of that name, no permission, a read-only file system
            raise TransformerMTError(
                f"run_dir={folder}: cannot write the run folder ({error.strerror}): name a folder "
                "you can write to"
            ) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = describe_holder(handle.read())
            handle.close()
            raise RunFolderInUse(
                f"{self.path.parent} is in use by {holder}: one training command per run folder "
                "(eval and translate may read it meanwhile); wait for it to end, stop it, or use "
                "another run_dir"
            ) from None
        except OSError as error:  # ENOLCK, ENOSYS, EOPNOTSUPP: this file system cannot lock
            handle.close()
            raise TransformerMTError(
                f"run_dir={folder}: its file system cannot lock files ({error.strerror}), so one "
                "writer per run folder cannot be guaranteed: put run_dir on a local disk or a "
                "file system with working flock (NFS with its lock service, Lustre mounted with "
                "flock)"
            ) from None
        return handle

    def __exit__(self, *exc_info) -> None:
        if self.handle is not None:
            self.handle.truncate(0)
            folder = self.path.parent
            if self.created_folder and [p.name for p in folder.iterdir()] == [self.path.name]:
                self.path.unlink()  # before the release: a waiting locker sees it gone
                with contextlib.suppress(OSError):
                    folder.rmdir()
            self.handle.close()  # releases the lock
            self.handle = None


def is_still_at(handle, path: Path) -> bool:
    """Whether the locked file is still the one at `path` (a holder that removed it on release
    leaves a locker of the old file holding a lock nobody else sees)."""
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        return f"PID {holder['pid']} on {holder['host']} (since {holder['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process (it has not yet written who it is)"
