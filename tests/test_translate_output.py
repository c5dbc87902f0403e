"""tmt-translate's output= and attention= files: written beside their targets and renamed once
every line is translated, so an input that fails on line 2 or a disk that fills up leaves the
previous file as it was, and never a file cut off mid-line."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from transformer_mt.commands import translate as command
from transformer_mt.config import DecodeConfig, compose_job
from transformer_mt.decode.translator import Translation
from transformer_mt.errors import TransformerMTError


class Upper:
    """A translator that upper-cases each line (what tmt-translate does with the results is
    what is tested here, not the search)."""

    decode = DecodeConfig()

    def translate_nbest(self, lines: list[str], attention=None) -> list[list[Translation]]:
        return [[Translation(line.upper(), 0.0)] for line in lines]


@pytest.fixture
def files(tmp_path, monkeypatch) -> dict[str, Path]:
    monkeypatch.setattr(command, "load_translator", lambda *args, **kwargs: Upper())
    paths = {name: tmp_path / f"{name}.txt" for name in ("input", "output", "attention")}
    paths["output"].write_text("the previous output\n")
    paths["attention"].write_text("the previous maps\n")
    return paths


def job_of(files: dict[str, Path], *extra: str):
    named = [f"input={files['input']}", f"output={files['output']}"]
    return compose_job("translate", ["run_dir=unused", *named, *extra])


def leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.glob(".*.tmp"))


@pytest.mark.parametrize("with_attention", [False, True])
def test_an_input_that_fails_on_line_2_leaves_the_previous_outputs(files, with_attention):
    files["input"].write_bytes(b"a first line\nbad \xff byte\n")
    extra = [f"attention={files['attention']}"] if with_attention else []
    with pytest.raises(TransformerMTError, match=r"input.txt:2: not valid UTF-8"):
        command.translate(job_of(files, *extra))
    assert files["output"].read_text() == "the previous output\n"
    assert files["attention"].read_text() == "the previous maps\n"
    assert leftovers(files["input"].parent) == []


def test_a_full_disk_leaves_the_previous_output_whole(files, monkeypatch):
    """What the CLI then says is true: nothing was left half-written."""
    files["input"].write_text("one\ntwo\n")
    write = command.translate_stream

    def fills_the_disk(translator, source, name, target, *args, **kwargs):
        target.write("ON")  # a line cut short, as a full disk leaves it
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(command, "translate_stream", fills_the_disk)
    with pytest.raises(OSError, match="No space left"):
        command.translate(job_of(files))
    assert files["output"].read_text() == "the previous output\n"
    assert leftovers(files["input"].parent) == []
    monkeypatch.setattr(command, "translate_stream", write)
    command.translate(job_of(files))
    assert files["output"].read_text() == "ONE\nTWO\n"
