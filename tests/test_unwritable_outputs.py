"""Outputs that cannot be written: refused before the work, in one line naming the file and its
folder (issue 66: on a read-only run folder tmt-eval decoded the whole split, then gave a
41-line traceback; tmt-average, tmt-export and tmt-translate's output= and attention= gave
tracebacks too). The folder is made unwritable to the check by os.access, which answers for the
mount and the user alike: the tests run as any user (root writes where a mode forbids it, so
chmod would not do, and a read-only bind mount needs root). What the check cannot foresee fails
when written, and the CLI says it in one line (`os_error_line`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from transformer_mt import cli, files
from transformer_mt.commands import average, evaluate, export, translate
from transformer_mt.config import compose_job
from transformer_mt.files import NotWritable


@pytest.fixture
def read_only(monkeypatch):
    """The folders added to the returned set are unwritable, as on a read-only file system."""
    folders: set[Path] = set()
    access = os.access

    def refused(path, mode, **options) -> bool:
        if mode & os.W_OK and Path(path).resolve() in folders:
            return False
        return access(path, mode, **options)

    monkeypatch.setattr(files.os, "access", refused)
    return folders


def no_work(*args, **kwargs):
    raise AssertionError("the work began before the outputs were checked")


@pytest.mark.parametrize(
    ("command", "written"),
    [
        ("eval", "hypotheses.test.txt"),
        ("average", "checkpoints/averaged.pt"),
        ("export", "checkpoints/ctranslate2"),
        ("translate output", "o.txt"),
        ("translate attention", "a.jsonl"),
    ],
)
def test_an_unwritable_output_is_refused_in_one_line_before_the_work(
    one_update_run, tmp_path, monkeypatch, read_only, command, written
):
    for module, name in (
        (evaluate, "load_translator"),
        (translate, "load_translator"),
        (average, "average_checkpoints"),
        (export, "load_run_checkpoint"),
    ):
        monkeypatch.setattr(module, name, no_work)
    monkeypatch.setattr(export, "import_ctranslate2", lambda: None)  # the export extra or not
    target = one_update_run / written
    read_only.add(target.parent.resolve())
    run_dir = f"run_dir={one_update_run}"
    (tmp_path / "in.txt").write_text("a b\n")
    source = f"input={tmp_path / 'in.txt'}"
    calls = {
        "eval": lambda: evaluate.evaluate(compose_job("eval", [run_dir])),
        "average": lambda: average.average(compose_job("average", [run_dir, "last=1"])),
        "export": lambda: export.export(compose_job("export", [run_dir])),
        "translate output": lambda: translate.translate(
            compose_job("translate", [run_dir, source, f"output={target}"])
        ),
        "translate attention": lambda: translate.translate(
            compose_job("translate", [run_dir, source, f"attention={target}"])
        ),
    }
    before = sorted(path.name for path in target.parent.iterdir())
    with pytest.raises(NotWritable) as refused:
        calls[command]()
    line = str(refused.value)
    assert "\n" not in line and str(target) in line and f"{target.parent} may not be" in line
    assert sorted(path.name for path in target.parent.iterdir()) == before


@pytest.mark.parametrize("number", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_a_write_the_file_system_refuses_is_one_line(number):
    error = OSError(number, os.strerror(number), "/mnt/run/scores.test.json")
    line = cli.os_error_line(error)
    assert line is not None and "\n" not in line
    assert "/mnt/run/scores.test.json" in line and "nothing was left half-written" in line
    assert cli.os_error_line(OSError(errno.ENOENT, "No such file or directory")) is None
