"""tmt-translate's output= and attention= files: written beside their targets and renamed once
every line is translated, so an input that fails on line 2 or a disk that fills up leaves the
previous file as it was, and never a file cut off mid-line."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from console_commands import BIN, run_command

from transformer_mt.commands import translate as command
from transformer_mt.config import DecodeConfig, compose_job
from transformer_mt.decode.translator import Translation
from transformer_mt.errors import Stopped, TransformerMTError
from transformer_mt.files import lock_while_written


class Upper:
    """A translator that upper-cases each line (what tmt-translate does with the results is
    what is tested here, not the search)."""

    decode = DecodeConfig()

    def translate_nbest(self, lines: list[str], **_) -> list[list[Translation]]:
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


def test_an_output_that_is_a_link_writes_the_links_target(files, tmp_path):
    """Issue 66: output= a symbolic link was replaced by a plain file, and the file it pointed
    to kept its old content. Now the target is written, and the link stays a link."""
    files["input"].write_text("one\n")
    real = tmp_path / "real.txt"
    real.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to("real.txt")
    command.translate(job_of({**files, "output": link}))
    assert link.is_symlink() and os.readlink(link) == "real.txt"
    assert real.read_text() == "ONE\n"
    assert leftovers(tmp_path) == []


def test_a_stop_signal_leaves_the_previous_outputs_and_no_temporary(files):
    """Issue 66: SIGTERM (as SIGINT and SIGHUP) ended tmt-translate at once, leaving
    .output.txt.RANDOM.tmp beside the output for good. Now it raises Stopped where the work is:
    the temporaries are removed on the way out, and the handlers before it come back."""
    files["input"].write_text("one\ntwo\n")
    before = {number: signal.getsignal(number) for number in command.STOP_SIGNALS}

    for number in command.STOP_SIGNALS:

        def signalled(translator, source, name, target, *args, number=number, **kwargs):
            target.write("ON")
            signal.raise_signal(number)
            raise AssertionError("the signal did not stop the work")

        with pytest.raises(Stopped) as stopped, pytest.MonkeyPatch.context() as patch:
            patch.setattr(command, "translate_stream", signalled)
            command.translate(job_of(files, f"attention={files['attention']}"))
        assert stopped.value.signum == number
        assert files["output"].read_text() == "the previous output\n"
        assert files["attention"].read_text() == "the previous maps\n"
        assert leftovers(files["input"].parent) == []
        assert {number: signal.getsignal(number) for number in command.STOP_SIGNALS} == before


def test_a_temporary_a_killed_writer_left_is_removed_by_the_next_one(files):
    """After SIGKILL (no handler runs) the temporary stays; the next tmt-translate writing the
    same file removes it, but not one that a running writer holds, nor another file's."""
    folder = files["input"].parent
    files["input"].write_text("one\n")
    killed = folder / ".output.txt.0123abcd.tmp"
    killed.write_text("half a transl")
    others = folder / ".attention.txt.89abcdef.tmp"
    others.write_text("another file's")
    running = folder / ".output.txt.4567cdef.tmp"
    with open(running, "w") as held:
        lock_while_written(held)  # a tmt-translate still writing it
        command.translate(job_of(files))
        assert leftovers(folder) == sorted([others.name, running.name])
    assert files["output"].read_text() == "ONE\n"


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.05)


@pytest.mark.slow
def test_tmt_translate_stopped_says_one_line_and_killed_is_cleaned_up_by_the_next(
    one_update_run, tmp_path
):
    """The command itself: SIGTERM once the output's temporary exists (the work has begun)
    ends it with one line and exit 128 + 15, the old output whole and no temporary; SIGKILL
    leaves its temporary, which the next tmt-translate of the same output removes."""
    big = tmp_path / "big.txt"
    big.write_text("the dog sees the cat .\n" * 20_000)
    output = tmp_path / "out.txt"
    output.write_text("old\n")
    settings = [f"run_dir={one_update_run}", f"output={output}", "decode=greedy"]
    for stop in (signal.SIGTERM, signal.SIGKILL):
        process = subprocess.Popen(
            [str(BIN / "tmt-translate"), *settings, f"input={big}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: leftovers(tmp_path))
        process.send_signal(stop)
        _, stderr = process.communicate(timeout=120)
        assert output.read_text() == "old\n"
        if stop == signal.SIGTERM:
            errors = [line for line in stderr.splitlines() if "][ERROR]" in line]
            assert process.returncode == 128 + signal.SIGTERM, stderr
            assert len(errors) == 1 and "stopped by SIGTERM: nothing was left" in errors[0]
            assert "Traceback" not in stderr and leftovers(tmp_path) == []
        else:
            assert process.returncode == -signal.SIGKILL
            assert len(leftovers(tmp_path)) == 1
    done = run_command("tmt-translate", *settings, stdin=b"the cat .\n")
    assert done.returncode == 0, done.stderr.decode()
    assert leftovers(tmp_path) == [] and len(output.read_text().splitlines()) == 1
