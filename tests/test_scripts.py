"""The scripts behind make bench, bench-data, bench-decode, bench-serve, fault-drill and gpu-check
still run against the library as it is (a change of a library call once broke make bench
unnoticed): every script's --help, and the cheap ones for real at toy size."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))


def run(*command: str, timeout: int = 300) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": sys.executable}  # gpu_check.sh: this interpreter
    return subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_script_starts(script):
    done = run(sys.executable, str(script), "--help")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


@pytest.mark.slow
def test_bench_train_runs_ours_and_marian_at_toy_size():
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    done = run(
        sys.executable,
        "scripts/bench_train.py",
        *("--data", "toy", "--vocab", "2000", "--model", "tiny", "--steps", "1", "--warmup", "0"),
    )
    assert done.returncode == 0, done.stderr
    assert "ours (transformer_mt)" in done.stdout and "marian (transformers" in done.stdout
    assert "ours / marian:" in done.stdout


@pytest.mark.slow
def test_bench_data_runs_at_toy_size(tmp_path):
    done = run(
        sys.executable,
        "scripts/bench_data.py",
        *("--sizes", "3000", "--slice", "1000", "--vocab", "500", "--workdir", str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    assert "prepare 3,000 pairs" in done.stdout and "rank 1 of 2 walking" in done.stdout


def test_gpu_check_without_a_gpu_says_so_in_one_line():
    done = run("bash", "scripts/gpu_check.sh", timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == [
        "gpu-check: no CUDA GPU visible (torch.cuda.is_available() is False); nothing to measure"
    ]
