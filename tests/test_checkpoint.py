"""Checkpoints are written atomically and refused clearly when missing, truncated or foreign;
a file that could not be read now is told apart from a damaged one."""

import errno
import pickle

import pytest
import torch

from transformer_mt.checkpoint import (
    Progress,
    load_checkpoint,
    prune_step_checkpoints,
    save_checkpoint,
)
from transformer_mt.checkpoint import format as checkpoint_format
from transformer_mt.errors import CheckpointError, DamagedCheckpoint

STATE = {"model": {"w": torch.ones(3)}, "model_config": {"d_model": 8}, "vocab_size": 10, "step": 7}


def test_round_trip(tmp_path):
    save_checkpoint(STATE, tmp_path / "c.pt")
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert loaded["step"] == 7 and torch.equal(loaded["model"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left behind


def test_missing(tmp_path):
    with pytest.raises(CheckpointError, match="nothing.pt: checkpoint not found"):
        load_checkpoint(tmp_path / "nothing.pt")


def test_truncated(tmp_path):
    save_checkpoint(STATE, tmp_path / "c.pt")
    data = (tmp_path / "c.pt").read_bytes()
    (tmp_path / "c.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(DamagedCheckpoint, match="c.pt: truncated or corrupt$"):
        load_checkpoint(tmp_path / "c.pt")
    (tmp_path / "c.pt").write_bytes(b"")
    with pytest.raises(DamagedCheckpoint, match="c.pt: truncated or corrupt$"):
        load_checkpoint(tmp_path / "c.pt")
    # Cut where torch's zip reader seeks before the file's start: an OSError (EINVAL), yet
    # damage, not a read that failed.
    save_checkpoint({**STATE, "model": {"w": torch.zeros(100_000)}}, tmp_path / "c.pt")
    (tmp_path / "c.pt").write_bytes((tmp_path / "c.pt").read_bytes()[:5000])
    with pytest.raises(DamagedCheckpoint, match="c.pt: truncated or corrupt$") as damaged:
        load_checkpoint(tmp_path / "c.pt")
    assert isinstance(damaged.value.__cause__, OSError)


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (OSError(errno.EIO, "Input/output error"), "Input/output error, EIO"),
        (PermissionError(errno.EACCES, "Permission denied"), "Permission denied, EACCES"),
        (MemoryError(), "out of memory"),
    ],
)
def test_a_read_that_fails_is_not_taken_for_a_damaged_file(tmp_path, monkeypatch, failure, said):
    save_checkpoint(STATE, tmp_path / "c.pt")

    def failing(*args, **kwargs):
        raise failure

    monkeypatch.setattr(checkpoint_format.torch, "load", failing)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path / "c.pt")
    assert not isinstance(error.value, DamagedCheckpoint)
    assert str(error.value) == (
        f"{tmp_path / 'c.pt'}: could not be read ({said}); the file is left as it is: rerun once "
        "it can be read"
    )


def test_foreign_torch_file(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(DamagedCheckpoint, match="not a transformer_mt checkpoint"):
        load_checkpoint(tmp_path / "other.pt")


class Arbitrary:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_arbitrary_pickle_is_refused_not_executed(tmp_path, capsys):
    (tmp_path / "evil.pt").write_bytes(pickle.dumps(Arbitrary()))
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "evil.pt")
    assert "this must never run" not in capsys.readouterr().out


def test_a_torch_file_of_python_objects_is_named_foreign_in_one_line(tmp_path):
    torch.save({"model": Arbitrary()}, tmp_path / "objects.pt")
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path / "objects.pt")
    assert str(error.value) == (
        f"{tmp_path / 'objects.pt'}: not a transformer_mt checkpoint (it holds Python objects, "
        "which are never unpickled here)"
    )


def test_failed_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(STATE, tmp_path / "c.pt")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError):
        save_checkpoint({**STATE, "step": 8}, tmp_path / "c.pt")
    assert load_checkpoint(tmp_path / "c.pt")["step"] == 7
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_prune_keeps_newest(tmp_path):
    for step in (5, 10, 15, 20):
        (tmp_path / f"step_{step}.pt").write_bytes(b"x")
    prune_step_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_15.pt", "step_20.pt"]


def test_link_atomically_gives_a_second_name_to_the_same_checkpoint(tmp_path):
    from transformer_mt.files import link_atomically

    save_checkpoint(STATE, tmp_path / "step_7.pt")
    save_checkpoint({**STATE, "step": 3}, tmp_path / "last.pt")
    link_atomically(tmp_path / "step_7.pt", tmp_path / "last.pt")
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 7
    (tmp_path / "step_7.pt").unlink()  # pruning a step file keeps last.pt intact
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_damaged_step_files_are_kept_aside_under_names_the_folder_never_takes(tmp_path):
    from transformer_mt.checkpoint import CheckpointFolder, step_checkpoints

    for name in ("step_2.pt", "step_4.pt", "step_6.pt", "step_4.damaged.pt"):
        (tmp_path / name).write_bytes(name.encode())
    kept = CheckpointFolder(tmp_path).keep_aside_newer_than(2)
    assert [p.name for p in kept] == ["step_4.damaged-2.pt", "step_6.damaged.pt"]
    assert (tmp_path / "step_4.damaged-2.pt").read_bytes() == b"step_4.pt"
    assert (tmp_path / "step_4.damaged.pt").read_bytes() == b"step_4.damaged.pt"
    assert step_checkpoints(tmp_path) == [tmp_path / "step_2.pt"]  # never resumed or pruned
    prune_step_checkpoints(tmp_path, keep=0)
    assert len(list(tmp_path.glob("*.damaged*.pt"))) == 3


# Where training stands, as checkpoints have always saved it (one flat record, in this order;
# validated_step added last, by the checkpoints of a later version).
SAVED_PROGRESS = {
    "step": 7,
    "epoch": 1,
    "batch_in_epoch": 3,
    "batches_in_epoch": 10,
    "layout": [1, 1500],
    "train_seconds": 12.5,
    "skipped_updates": 2,
    "best_score": -3.25,
    "best_step": 6,
    "validations_without_improvement": 1,
    "validated_step": 6,
}


def test_the_progress_split_by_owner_saves_the_record_checkpoints_always_held():
    progress = Progress.from_state(SAVED_PROGRESS)
    assert (progress.step, progress.counts.train_seconds) == (7, 12.5)  # the loop's
    assert (progress.position.epoch, progress.position.batch_in_epoch) == (1, 3)  # the batches'
    assert (progress.validation.best_score, progress.validation.best_step) == (-3.25, 6)
    assert list(progress.as_state().items()) == list(SAVED_PROGRESS.items())
    older = Progress.from_state({"step": 4, "epoch": 2})  # fields it lacked: their defaults
    assert (older.step, older.position.epoch, older.validation.best_score) == (4, 2, None)
    assert older.validation.validated_step is None  # its final validation is not known: redone
