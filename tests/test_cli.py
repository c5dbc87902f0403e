"""The console commands: user mistakes give one clear line and a non-zero exit, no traceback."""

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

from console_commands import BIN, run_command, run_commands_together

from transformer_mt.data.tokenizer import Tokenizer

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_a_value_hydra_refuses_is_one_line_naming_the_key_and_exit_2(tmp_path):
    """Issue 59, finding 15: Hydra's own refusals (a value of the wrong type, an unknown key)
    exited 1 with several lines, as a crash does, where the project's checks exit 2."""
    refused = [
        ("tmt-train", "decode.batch_shape=wide", "decode.batch_shape"),
        ("tmt-train", "trainer.compile=null", "trainer.compile"),
        ("tmt-train", "model.d_modle=7", "model.d_modle"),
        ("tmt-translate", "decode.batch_shape=wide", "decode.batch_shape"),
    ]
    results = run_commands_together(
        [[command, f"run_dir={tmp_path / 'run'}", override] for command, override, _ in refused]
    )
    for (_, _, key), result in zip(refused, results, strict=True):
        lines = result.stderr.decode().strip().splitlines()
        assert result.returncode == 2, result.stderr.decode()
        assert len(lines) == 1 and f"config key '{key}': " in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_impossible_value_is_named(tmp_path):
    result = run_command("tmt-train", f"run_dir={tmp_path}", "model.n_heads=7")
    stderr = result.stderr.decode()
    assert result.returncode == 2
    assert "model.d_model" in stderr and "n_heads=7" in stderr
    assert "Traceback" not in stderr


def test_missing_checkpoint_is_named(tmp_path):
    (tmp_path / "config.yaml").write_text("data: {}\n")
    result = run_command("tmt-eval", f"run_dir={tmp_path}", "checkpoint=missing.pt")
    stderr = result.stderr.decode()
    assert result.returncode == 2
    assert str(tmp_path / "checkpoints" / "missing.pt") in stderr and "not found" in stderr
    assert "Traceback" not in stderr


def test_mismatched_parallel_files_are_named(tmp_path):
    (tmp_path / "train.de").write_text("a\nb\nc\n")
    (tmp_path / "train.en").write_text("a\nb\n")
    (tmp_path / "valid.de").write_text("a\n")
    (tmp_path / "valid.en").write_text("a\n")
    result = run_command(
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


def test_translate_keeps_one_output_line_per_input_line(tmp_path, one_update_run):
    """Unicode line separators inside a line must not split it; invalid UTF-8 is named."""
    lines = "the dog.\nthe cat\u2028sees the dog.\n\nthe man.\n".encode()
    result = run_command(
        "tmt-translate", f"run_dir={tmp_path / 'run'}", "decode=greedy", stdin=lines
    )
    assert result.returncode == 0, result.stderr.decode()
    assert len(result.stdout.decode("utf-8").split("\n")) == 5  # 4 lines + the final newline
    result = run_command("tmt-translate", f"run_dir={tmp_path / 'run'}", stdin=b"ok\n\xff\n")
    assert result.returncode == 2 and "<stdin>:2: not valid UTF-8" in result.stderr.decode()


def test_translate_files_and_nbest_lists(tmp_path, one_update_run):
    (tmp_path / "in.txt").write_text("the dog.\n\nthe man sees the cat.\n", encoding="utf-8")
    run_dir, files = f"run_dir={tmp_path / 'run'}", [f"input={tmp_path / 'in.txt'}"]
    out, attention = tmp_path / "out.txt", tmp_path / "attention.jsonl"
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xff\n")
    translate = ["tmt-translate", run_dir, "decode.max_len_b=5"]
    to_file, nbest, attended, bad = run_commands_together(
        [
            [*translate, *files, f"output={out}"],
            [*translate, *files, "decode.nbest=3"],
            [*translate, *files, f"attention={attention}"],
            [*translate, f"input={tmp_path / 'bad.txt'}"],
        ]
    )
    assert to_file.returncode == 0, to_file.stderr.decode()
    assert to_file.stdout == b"" and len(out.read_text(encoding="utf-8").splitlines()) == 3

    assert nbest.returncode == 0, nbest.stderr.decode()
    entries = [line.split(" ||| ") for line in nbest.stdout.decode().splitlines()]
    assert [int(e[0]) for e in entries] == [0, 0, 0, 1, 2, 2, 2]  # the empty line: one entry
    for number in (0, 2):
        scores = [float(e[3]) for e in entries if int(e[0]) == number]
        assert scores == sorted(scores, reverse=True)
    assert all(len(e) == 4 and e[2] == f"F0= {e[3]}" for e in entries)  # Moses' 4 fields

    assert bad.returncode == 2 and "bad.txt:2: not valid UTF-8" in bad.stderr.decode()

    assert attended.returncode == 0, attended.stderr.decode()
    translations = attended.stdout.decode().splitlines()
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


def test_at_a_terminal_each_line_is_translated_as_soon_as_it_is_entered(tmp_path, one_update_run):
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
