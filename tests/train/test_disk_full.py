"""A real full disk (a small tmpfs in a mount namespace of the test's own, not a faked
exception): a checkpoint write that fails is one line naming the intact previous checkpoint, and
the same command continues from it once there is space."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from toy_runs import TINY_TRAIN

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent

# Inside the namespace: a first start writes step_2.pt; the file system is then shrunk to what is
# used plus 60% of one checkpoint, so the write of step_4.pt fails; then it is grown again and
# the same command resumes. Logs and tensorboard events between two checkpoints take a few KB.
SCRIPT = r"""
set -u
mount -t tmpfs -o size=64m tmpfs "$MNT"
"$BIN/tmt-train" "$@" trainer.max_steps=2 > "$OUT/first.log" 2>&1 || exit 11
used=$(du -sk "$MNT" | cut -f1)
checkpoint=$(du -k "$MNT/run/checkpoints/step_2.pt" | cut -f1)
mount -o remount,size=$((used + checkpoint * 6 / 10))k "$MNT" || exit 12
"$BIN/tmt-train" "$@" > "$OUT/full.out" 2> "$OUT/full.err"
echo $? > "$OUT/full.rc"
ls -a "$MNT/run/checkpoints" > "$OUT/full.listing"
"$BIN/python" -c "import sys, torch; print(torch.load(sys.argv[1], weights_only=True)['step'])" \
    "$MNT/run/checkpoints/last.pt" > "$OUT/full.last_step" 2>&1
mount -o remount,size=64m "$MNT" || exit 13
"$BIN/tmt-train" "$@" > "$OUT/resumed.log" 2>&1
echo $? > "$OUT/resumed.rc"
"$BIN/python" -c "import sys, torch; print(torch.load(sys.argv[1], weights_only=True)['step'])" \
    "$MNT/run/checkpoints/last.pt" > "$OUT/resumed.last_step" 2>&1
cp "$MNT/run/history.jsonl" "$OUT/history.jsonl"
"""


def namespace_command() -> list[str] | None:
    """How to run a script in a mount namespace of its own: as root, or as a user through a user
    namespace; None where neither works (not Linux, or user namespaces are off)."""
    if shutil.which("unshare") is None:
        return None
    for command in (["unshare", "-m"], ["unshare", "-Urm"]):
        probe = [*command, "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt 2>/dev/null"]
        if subprocess.run(probe, capture_output=True, timeout=30).returncode == 0:
            return command
    return None


@pytest.fixture
def small_disk(tmp_path) -> tuple[list[str], Path, Path]:
    """(the command that runs a script in a mount namespace, where the script mounts its tmpfs,
    where the script writes what the test reads)."""
    command = namespace_command()
    if command is None:
        pytest.skip("needs a mount namespace for a small tmpfs (unshare -m as root, or -Urm)")
    mount, out = tmp_path / "mnt", tmp_path / "out"
    mount.mkdir()
    out.mkdir()
    return command, mount, out


def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_run_resumes(tmp_path, small_disk):
    command, mount, out = small_disk
    overrides = [
        *TINY_TRAIN,
        f"run_dir={mount / 'run'}",
        f"data.prepared_dir={tmp_path / 'prepared'}",  # the corpus on the big disk
        "trainer.max_steps=6",
        "trainer.checkpoint_every=2",
        "trainer.valid_every=0",
        "trainer.valid_bleu_sentences=0",
        "trainer.keep_checkpoints=10",
    ]
    environment = {"MNT": str(mount), "OUT": str(out), "BIN": str(BIN), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [*command, "bash", "-c", SCRIPT, "script", *overrides],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout, done.stderr, *(p.read_text() for p in out.glob("*")))

    stderr = (out / "full.err").read_text()
    assert (out / "full.rc").read_text().strip() == "2", stderr
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1, stderr
    assert "could not write checkpoint" in errors[0] and "step_4.pt" in errors[0]
    assert "the disk is full" in errors[0]
    assert "the previous checkpoint" in errors[0] and "(update 2) is intact" in errors[0]
    listing = (out / "full.listing").read_text().split()
    assert "step_2.pt" in listing and "step_4.pt" not in listing
    assert not [name for name in listing if name.endswith(".tmp")]  # the partial write is gone
    assert (out / "full.last_step").read_text().strip() == "2"

    assert (out / "resumed.rc").read_text().strip() == "0", (out / "resumed.log").read_text()
    assert (out / "resumed.last_step").read_text().strip() == "6"
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    events = [(r["event"], r.get("kind") or r.get("how"), r["step"]) for r in records]
    assert events == [
        ("start", "new", 0),
        ("end", "finished", 2),
        ("start", "resume", 2),
        ("end", "error", 4),  # the update whose checkpoint could not be written
        ("start", "resume", 2),
        ("end", "finished", 6),
    ], events


PREPARE_ON_A_SMALL_DISK = r"""
mount -t tmpfs -o size="$SIZE" tmpfs "$MNT" || exit 11
"$BIN/tmt-prepare" "$@" > "$OUT/prepare.out" 2> "$OUT/prepare.err"
echo $? > "$OUT/prepare.rc"
ls -a "$MNT/prepared" > "$OUT/listing" 2>&1
"""


@pytest.mark.parametrize("size", ["60k", "400k"])  # full while encoding; while writing the store
def test_a_full_disk_while_preparing_is_one_line_and_leaves_no_folder(tmp_path, small_disk, size):
    command, mount, out = small_disk
    overrides = [
        *TINY_TRAIN,
        f"run_dir={tmp_path / 'run'}",
        f"data.prepared_dir={mount / 'prepared'}",
    ]
    environment = {"MNT": str(mount), "OUT": str(out), "BIN": str(BIN), "SIZE": size}
    done = subprocess.run(
        [*command, "bash", "-c", PREPARE_ON_A_SMALL_DISK, "script", *overrides],
        env={**environment, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    stderr = (out / "prepare.err").read_text()
    assert (out / "prepare.rc").read_text().strip() == "2", stderr
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and "the disk is full" in errors[0], stderr
    assert (out / "listing").read_text().split() == [".", ".."]  # nothing half-built left
