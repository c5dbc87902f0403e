"""No command deletes what it did not create: every output path is checked before anything is
written, and a refusal leaves every file byte-identical."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from console_commands import BIN, run_command, run_commands_together

from transformer_mt.files import NotOursToReplace, replacing_folder

pytestmark = pytest.mark.slow


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative path -> sha256 of its bytes)."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def trained(one_update_template, tmp_path_factory) -> Path:
    """A folder apart from tmp_path that holds the test's own copy of a one-update run folder
    (run/) and nothing else."""
    folder = tmp_path_factory.mktemp("trained")
    shutil.copytree(one_update_template, folder / "run")
    return folder


def refused_one_line(result: subprocess.CompletedProcess, *fragments: str) -> str:
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in stderr, stderr
    return stderr


@pytest.mark.parametrize("export_format", ["ctranslate2", "transformers"])
def test_an_export_never_replaces_a_folder_that_is_not_an_export(trained, tmp_path, export_format):
    run_dir = trained / "run"
    unrelated = tmp_path / "photos"
    unrelated.mkdir()
    (unrelated / "holiday.jpg").write_bytes(b"\xff\xd8 not ours")
    outputs = [".", "..", run_dir, run_dir / "checkpoints", unrelated]
    before, before_unrelated = snapshot(trained), snapshot(unrelated)
    results = run_commands_together(
        [
            ["tmt-export", f"run_dir={run_dir}", f"output={output}", f"format={export_format}"]
            for output in outputs
        ]
    )
    for result in results:
        refused_one_line(result, "is not a model folder written by tmt-export", "left as it is")
    assert snapshot(trained) == before
    assert snapshot(unrelated) == before_unrelated


def test_an_export_replaces_its_own_previous_export(trained, tmp_path):
    output = tmp_path / "ct2"
    for _ in range(2):  # the second replaces the first
        result = run_command("tmt-export", f"run_dir={trained / 'run'}", f"output={output}")
        assert result.returncode == 0, result.stderr.decode()
    assert (output / "model.bin").is_file() and (output / "transformer_mt.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # nothing left beside it


def test_a_failed_export_leaves_the_previous_one_in_place(tmp_path):
    folder = tmp_path / "export"
    with replacing_folder(folder, marker="mark", what="ours") as temporary:
        (temporary / "mark").write_text("1")
    with pytest.raises(RuntimeError), replacing_folder(folder, marker="mark", what="ours") as new:
        (new / "mark").write_text("2")
        raise RuntimeError("the exporter failed half way")
    assert (folder / "mark").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    (folder / "mark").unlink()  # no longer ours: refused, untouched
    (folder / "kept").write_text("x")
    with pytest.raises(NotOursToReplace), replacing_folder(folder, marker="mark", what="ours"):
        pass
    assert sorted(p.name for p in folder.iterdir()) == ["kept"]


def test_translate_refuses_an_output_that_is_its_input(trained, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("the dog sees the cat .\n", encoding="utf-8")
    link = tmp_path / "link.txt"
    os.symlink(source, link)
    run_dir = f"run_dir={trained / 'run'}"
    cases = [
        (f"input={source}", f"output={source}"),
        (f"input={source}", f"output={link}"),  # the same file through a link
        (f"input={source}", f"output={tmp_path / 'out.txt'}", f"attention={source}"),
        (f"input={source}", f"output={tmp_path / 'o.txt'}", f"attention={tmp_path / 'o.txt'}"),
    ]
    for result in run_commands_together([["tmt-translate", run_dir, *case] for case in cases]):
        refused_one_line(result, "is the same file as")
    assert source.read_text(encoding="utf-8") == "the dog sees the cat .\n"
    assert not (tmp_path / "out.txt").exists() and not (tmp_path / "o.txt").exists()


def test_average_refuses_the_names_of_training_checkpoints(trained):
    before = snapshot(trained)
    names = ["last.pt", "best.pt", "step_1.pt"]
    averaging = ["tmt-average", f"run_dir={trained / 'run'}", "last=1"]
    for result in run_commands_together([[*averaging, f"output={name}"] for name in names]):
        refused_one_line(result, "config key 'output'", "name of a training checkpoint")
    assert snapshot(trained) == before


def test_translate_refuses_an_output_that_is_its_standard_input(trained, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("the dog sees the cat .\n", encoding="utf-8")
    link = tmp_path / "link.txt"
    os.symlink(source, link)
    for output in (source, link):
        with source.open("rb") as stdin:  # tmt-translate output=in.txt < in.txt
            result = subprocess.run(
                [str(BIN / "tmt-translate"), f"run_dir={trained / 'run'}", f"output={output}"],
                stdin=stdin,
                capture_output=True,
                timeout=300,
            )
        refused_one_line(result, "config key 'output'", "is the file standard input reads")
        assert source.read_text(encoding="utf-8") == "the dog sees the cat .\n"


def test_average_replaces_only_an_average_it_wrote(trained, tmp_path):
    run_dir = trained / "run"
    copy = tmp_path / "copy.pt"  # a checkpoint, but no average
    copy.write_bytes((run_dir / "checkpoints" / "last.pt").read_bytes())
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    before, before_mine = snapshot(trained), snapshot(tmp_path)
    outputs = (run_dir / "config.yaml", run_dir, copy, notes)
    averaging = ["tmt-average", f"run_dir={run_dir}", "last=1"]
    for result in run_commands_together([[*averaging, f"output={output}"] for output in outputs]):
        refused_one_line(
            result, "config key 'output'", "is not an average written by tmt-average", "left as it"
        )
    assert snapshot(trained) == before and snapshot(tmp_path) == before_mine
    average = tmp_path / "average.pt"
    for _ in range(2):  # the second replaces the first
        result = run_command("tmt-average", f"run_dir={run_dir}", "last=1", f"output={average}")
        assert result.returncode == 0, result.stderr.decode()
