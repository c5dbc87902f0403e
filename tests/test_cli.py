"""The console commands: user mistakes give one clear line and a non-zero exit, no traceback."""

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_mt.data.tokenizer import Tokenizer

BIN = Path(sys.executable).parent
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def run(command: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / command), *args], input=stdin, capture_output=True, timeout=120
    )


def test_unknown_config_key_is_named_without_traceback(tmp_path):
    result = run("tmt-train", f"run_dir={tmp_path}", "model.d_modle=7")
    stderr = result.stderr.decode()
    assert result.returncode != 0
    assert "d_modle" in stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    "command,override,key",
    [
        ("tmt-train", "decode.batch_shape=wide", "decode.batch_shape"),
        ("tmt-train", "trainer.compile=null", "trainer.compile"),
        ("tmt-train", "model.d_modle=7", "model.d_modle"),
        ("tmt-translate", "decode.batch_shape=wide", "decode.batch_shape"),
    ],
)
def test_a_value_hydra_refuses_is_one_line_naming_the_key_and_exit_2(
    tmp_path, command, override, key
):
    """Issue 59, finding 15: Hydra's own refusals (a value of the wrong type, an unknown key)
    exited 1 with several lines, as a crash does, where the project's checks exit 2."""
    result = run(command, f"run_dir={tmp_path / 'run'}", override)
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode == 2, result.stderr.decode()
    assert len(lines) == 1 and f"config key '{key}': " in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_impossible_value_is_named(tmp_path):
    result = run("tmt-train", f"run_dir={tmp_path}", "model.n_heads=7")
    stderr = result.stderr.decode()
    assert result.returncode == 2
    assert "model.d_model" in stderr and "n_heads=7" in stderr
    assert "Traceback" not in stderr


def test_missing_checkpoint_is_named(tmp_path):
    (tmp_path / "config.yaml").write_text("data: {}\n")
    result = run("tmt-eval", f"run_dir={tmp_path}", "checkpoint=missing.pt")
    stderr = result.stderr.decode()
    assert result.returncode == 2
    assert str(tmp_path / "checkpoints" / "missing.pt") in stderr and "not found" in stderr
    assert "Traceback" not in stderr


def test_mismatched_parallel_files_are_named(tmp_path):
    (tmp_path / "train.de").write_text("a\nb\nc\n")
    (tmp_path / "train.en").write_text("a\nb\n")
    (tmp_path / "valid.de").write_text("a\n")
    (tmp_path / "valid.en").write_text("a\n")
    result = run(
        "tmt-train",
        f"run_dir={tmp_path / 'run'}",
        "data=files",
        f"data.dir={tmp_path}",
        "model=tiny",
        f"data.prepared_dir={tmp_path / 'prepared'}",
    )
    stderr = result.stderr.decode()
    assert result.returncode == 2
    assert "train.de has 3 lines" in stderr and "train.en has 2 lines" in stderr
    assert "Traceback" not in stderr


def train_one_update(tmp_path: Path) -> None:
    """A run folder at tmp_path/run with a one-update tiny model (enough to translate with)."""
    from transformer_mt.commands.train import train
    from transformer_mt.config import compose_job

    overrides = [
        "data=toy",
        "data.toy_sizes=[300,20,20]",
        "data.vocab_size=400",
        "model=tiny",
        "trainer.max_steps=1",
        "trainer.batch_tokens=1000",
        "trainer.progress_bar=false",
        "trainer.loader_workers=0",
        f"run_dir={tmp_path / 'run'}",
        f"data.prepared_dir={tmp_path / 'p'}",
    ]
    train(compose_job("train", overrides))


def test_translate_keeps_one_output_line_per_input_line(tmp_path):
    """Unicode line separators inside a line must not split it; invalid UTF-8 is named."""
    train_one_update(tmp_path)
    lines = "the dog.\nthe cat\u2028sees the dog.\n\nthe man.\n".encode()
    result = run("tmt-translate", f"run_dir={tmp_path / 'run'}", "decode=greedy", stdin=lines)
    assert result.returncode == 0, result.stderr.decode()
    assert len(result.stdout.decode("utf-8").split("\n")) == 5  # 4 lines + the final newline
    result = run("tmt-translate", f"run_dir={tmp_path / 'run'}", stdin=b"ok\n\xff\n")
    assert result.returncode == 2 and "<stdin>:2: not valid UTF-8" in result.stderr.decode()


def test_translate_files_and_nbest_lists(tmp_path):
    train_one_update(tmp_path)
    (tmp_path / "in.txt").write_text("the dog.\n\nthe man sees the cat.\n", encoding="utf-8")
    run_dir, files = f"run_dir={tmp_path / 'run'}", [f"input={tmp_path / 'in.txt'}"]
    out = tmp_path / "out.txt"
    result = run("tmt-translate", run_dir, *files, f"output={out}", "decode.max_len_b=5")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == b"" and len(out.read_text(encoding="utf-8").splitlines()) == 3

    result = run("tmt-translate", run_dir, *files, "decode.nbest=3", "decode.max_len_b=5")
    assert result.returncode == 0, result.stderr.decode()
    entries = [line.split(" ||| ") for line in result.stdout.decode().splitlines()]
    assert [int(e[0]) for e in entries] == [0, 0, 0, 1, 2, 2, 2]  # the empty line: one entry
    for number in (0, 2):
        scores = [float(e[3]) for e in entries if int(e[0]) == number]
        assert scores == sorted(scores, reverse=True)
    assert all(len(e) == 4 and e[2] == f"F0= {e[3]}" for e in entries)  # Moses' 4 fields

    attention = tmp_path / "attention.jsonl"
    result = run("tmt-translate", run_dir, *files, f"attention={attention}", "decode.max_len_b=5")
    assert result.returncode == 0, result.stderr.decode()
    translations = result.stdout.decode().splitlines()
    records = [json.loads(line) for line in attention.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in records] == [0, 1, 2] and records[1]["weights"] is None
    for number in (0, 2):
        record, translation = records[number], translations[number]
        assert len(record["target_pieces"]) == len(record["weights"])
        pieces = record["target_pieces"][:-1]
        assert Tokenizer(tmp_path / "run" / "spm.model").processor.decode(pieces) == translation
        for row in record["weights"]:
            assert len(row) == len(record["source_pieces"]) and abs(sum(row) - 1) < 1e-5
    plotted = subprocess.run(
        [sys.executable, str(SCRIPTS / "plot_attention.py"), str(attention), "--line", "2"]
        + ["--output", str(tmp_path / "attention.png")],
        capture_output=True,
    )
    assert plotted.returncode == 0, plotted.stderr.decode()
    assert (tmp_path / "attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    (tmp_path / "bad.txt").write_bytes(b"ok\n\xff\n")
    result = run("tmt-translate", run_dir, f"input={tmp_path / 'bad.txt'}")
    assert result.returncode == 2 and "bad.txt:2: not valid UTF-8" in result.stderr.decode()


def test_at_a_terminal_each_line_is_translated_as_soon_as_it_is_entered(tmp_path):
    train_one_update(tmp_path)
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [str(BIN / "tmt-translate"), f"run_dir={tmp_path / 'run'}", "decode=greedy"],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    os.close(terminal)
    try:
        os.write(controller, b"the dog sees the cat.\n")
        ready, _, _ = select.select([process.stdout], [], [], 90)
        assert ready, "no translation of line 1 while the terminal stays open"
        first = process.stdout.readline()  # line 2 is not written yet
        assert first.endswith(b"\n") and process.poll() is None
        os.write(controller, b"the man.\n\x04")  # Ctrl-D: end of input
        rest = process.stdout.read()
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        os.close(controller)
    assert len(rest.splitlines()) == 1
