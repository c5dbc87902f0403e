"""The console commands: user mistakes give one clear line and a non-zero exit, no traceback."""

import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


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
    result = run(
        "tmt-train",
        f"run_dir={tmp_path / 'run'}",
        "data=files",
        f"data.dir={tmp_path}",
        "model=tiny",
    )
    stderr = result.stderr.decode()
    assert result.returncode == 2
    assert "train.de has 3 lines" in stderr and "train.en has 2 lines" in stderr
    assert "Traceback" not in stderr
