"""A run's checkpoints/ folder, the one place that names its files: step_N.pt (the newest
trainer.keep_checkpoints kept), last.pt and best.pt (hard links to a step file, so nothing is
written twice), averaged.pt and exported model folders beside them, step_N.damaged.pt (a
damaged step file that a resume passed over, kept for the user to look at) and
step_N.abandoned.pt (a step file newer than the checkpoint trainer.resume_from continued from:
another branch of the run, which no later start resumes or averages)."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from transformer_mt.checkpoint.format import load_checkpoint, save_checkpoint
from transformer_mt.errors import CheckpointError, DamagedCheckpoint
from transformer_mt.files import link_atomically, remove_partial_writes

log = logging.getLogger(__name__)

STEP_FILE = re.compile(r"step_(\d+)\.pt")
LAST, BEST = "last.pt", "best.pt"
DAMAGED = "damaged"  # step_N.damaged.pt: a damaged step file a resume passed over, kept
ABANDONED = "abandoned"  # step_N.abandoned.pt: newer than the checkpoint resume_from took


def is_training_checkpoint(name: str) -> bool:
    """Whether `name` is one the trainer gives its checkpoints (which only the trainer writes)."""
    return name in (LAST, BEST) or STEP_FILE.fullmatch(name) is not None


def step_checkpoints(folder: Path) -> list[Path]:
    """The step_N.pt files in `folder`, oldest (smallest N) first."""
    numbered = sorted(
        (int(m.group(1)), p) for p in folder.glob("step_*.pt") if (m := STEP_FILE.fullmatch(p.name))
    )
    return [path for _, path in numbered]


def prune_step_checkpoints(folder: Path, keep: int) -> None:
    """Delete all but the newest `keep` step_N.pt files."""
    numbered = step_checkpoints(folder)
    for path in numbered[: max(0, len(numbered) - keep)]:
        path.unlink(missing_ok=True)


def newest_step_checkpoints(folder: Path, n: int) -> list[Path]:
    """The `n` step_N.pt files in `folder` with the largest N (by number, not by name), oldest
    first."""
    if n < 1:
        raise CheckpointError(f"cannot average {n} checkpoints: need at least one")
    numbered = step_checkpoints(Path(folder))
    if len(numbered) < n:
        raise CheckpointError(
            f"{folder}: {n} step checkpoints requested, but there are only {len(numbered)} "
            "(step_N.pt files; trainer.keep_checkpoints sets how many a run keeps)"
        )
    return numbered[-n:]


def load_newest_readable(folder: Path) -> tuple[dict[str, Any], Path] | None:
    """The newest checkpoint in `folder` that loads (step files newest first, then last.pt),
    or None when there is none at all. Only a damaged file (DamagedCheckpoint) is passed over,
    with a warning; one that could not be read now (an OSError, memory) stops the search with
    its CheckpointError, so that a resume never rolls a run back over a file that may be whole.
    CheckpointError when there are some but none loads."""
    candidates = [*reversed(step_checkpoints(folder)), folder / LAST]
    candidates = [path for path in candidates if path.is_file()]
    problems = []
    for path in candidates:
        try:
            return load_checkpoint(path), path
        except DamagedCheckpoint as error:
            log.warning(
                "%s; trying the previous checkpoint (a resume from it keeps this file aside as "
                "%s, which no run overwrites)",
                error,
                aside_path(path).name,
            )
            problems.append(str(error))
    if problems:
        raise CheckpointError(f"no readable checkpoint in {folder}: " + "; ".join(problems))
    return None


def aside_path(path: Path, why: str = DAMAGED) -> Path:
    """Where a checkpoint set aside is kept: step_4.pt -> step_4.damaged.pt (then
    step_4.damaged-2.pt, ...; `why`: DAMAGED or ABANDONED), a name the folder never writes,
    prunes or resumes from."""
    for number in itertools.count(1):
        suffix = "" if number == 1 else f"-{number}"
        aside = path.with_name(f"{path.stem}.{why}{suffix}{path.suffix}")
        if not aside.exists():
            return aside
    raise AssertionError("unreachable")


class CheckpointFolder:
    """The checkpoints/ folder of a run (RunDir.checkpoints)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    @property
    def last(self) -> Path:
        return self.path / LAST

    @property
    def best(self) -> Path:
        return self.path / BEST

    def step_file(self, step: int) -> Path:
        return self.path / f"step_{step}.pt"

    def checkpoint_files(self) -> list[Path]:
        """Every checkpoint file in the folder (for trainer.resume=never's refusal)."""
        return sorted(self.path.glob("*.pt")) if self.path.is_dir() else []

    def newest_readable(self) -> tuple[dict[str, Any], Path] | None:
        return load_newest_readable(self.path) if self.path.is_dir() else None

    def keep_aside_newer_than(self, step: int, *, abandoned: bool = False) -> list[Path]:
        """Rename every step file newer than update `step` to its aside_path, so that the run
        resumed from `step` never overwrites, resumes or averages it; the names given. Called
        (by rank 0, under the run's lock) once a resume from `step` is agreed. From the newest
        readable checkpoint, every newer step file was passed over as damaged
        (load_newest_readable tries the newest first and stops at a file it could not read);
        from trainer.resume_from (`abandoned`), newer ones are another branch of the run, and
        best.pt goes aside with the one it points at."""
        why, kept = ABANDONED if abandoned else DAMAGED, []
        for path in step_checkpoints(self.path):
            if int(STEP_FILE.fullmatch(path.name).group(1)) > step:
                if why == ABANDONED and self.best.is_file() and os.path.samefile(path, self.best):
                    kept.append(self.set_aside(self.best, why))
                kept.append(self.set_aside(path, why))
        return kept

    def set_aside(self, path: Path, why: str) -> Path:
        aside = aside_path(path, why)
        os.rename(path, aside)
        log.warning("kept the %s %s aside as %s", why, path.name, aside.name)
        return aside

    def newest_steps(self, n: int) -> list[Path]:
        return newest_step_checkpoints(self.path, n)

    def save(self, state: dict, step: int, *, best: bool, keep: int, previous: int) -> Path:
        """Write step_N.pt, point last.pt (and best.pt) at it, keep the newest `keep` step
        files; the name that holds it now (last.pt where keep=0 pruned step_N.pt). A write that
        fails (a full disk) is a CheckpointError that says which checkpoint (of update
        `previous`) is intact."""
        step_path = self.step_file(step)
        try:
            save_checkpoint(state, step_path)
        except OSError as error:
            raise CheckpointError(self.unwritten(step_path, error, previous)) from error
        if best:  # before last.pt: a resume from an older last.pt re-judges this step
            link_atomically(step_path, self.best)
        link_atomically(step_path, self.last)
        prune_step_checkpoints(self.path, keep)
        return step_path if step_path.is_file() else self.last

    def unwritten(self, step_path: Path, error: OSError, previous: int) -> str:
        """What a failed checkpoint write means for the user: which checkpoint is intact."""
        kept = (
            f"the previous checkpoint {self.last} (update {previous}) is intact"
            if self.last.is_file()
            else "there is no previous checkpoint"
        )
        cause = error.strerror or str(error)
        if error.errno == errno.ENOSPC:
            free = shutil.disk_usage(self.path).free / 2**20
            cause = f"{cause}: the disk is full, {free:.0f} MiB free"
        return (
            f"could not write checkpoint {step_path} ({cause}); {kept}: free space and rerun "
            "the same command to continue from it"
        )

    def point_last_at(self, path: Path, step: int) -> bool:
        """last.pt at the checkpoint a run resumes, `path` of update `step`, where it is this
        folder's (a kill between writing step_N.pt and linking last.pt leaves last.pt older, and
        every command that reads the run takes last.pt); whether last.pt now holds it (False:
        `path` lies elsewhere)."""
        if self.last.is_file() and os.path.samefile(path, self.last):
            return True
        step_path = self.step_file(step)
        if not (step_path.is_file() and os.path.samefile(path, step_path)):
            return False
        link_atomically(step_path, self.last)
        log.info("%s now points at update %d, the checkpoint this run resumes", LAST, step)
        return True

    def point_best_at(self, step: int) -> bool:
        """best.pt at step_N.pt of the recorded best score, if it points elsewhere (a kill
        between writing a new best step file and linking best.pt leaves it at the older best);
        whether it was moved."""
        step_path = self.step_file(step)
        if not step_path.is_file() or (
            self.best.is_file() and os.path.samefile(self.best, step_path)
        ):
            return False
        link_atomically(step_path, self.best)
        return True

    def remove_partial_writes(self) -> list[Path]:
        """Delete what an interrupted checkpoint write left, of the trainer's files only
        (tmt-average may be writing averaged.pt right now)."""
        if not self.path.is_dir():
            return []
        return remove_partial_writes(self.path, is_training_checkpoint)
