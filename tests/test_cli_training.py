"""Training through the console commands: pre-emption by SIGTERM, averaging, then eval."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_mt.commands.evaluate import evaluate
from transformer_mt.commands.train import train
from transformer_mt.config import compose_job

BIN = Path(sys.executable).parent
QUICK = [
    "trainer.valid_every=0",
    "trainer.valid_bleu_sentences=0",
    "trainer.checkpoint_every_minutes=0",
    "trainer.num_threads=1",
]


def default_hangup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP])
def test_stop_signal_saves_a_checkpoint_and_exits_cleanly(tiny_overrides, tmp_path, stop_signal):
    """Pre-emption (SIGTERM; Slurm's SIGUSR1 ahead of the time limit) and a terminal that closes
    (SIGHUP; review t6, D1: it ended the run with exit 129 and no checkpoint)."""
    run_dir = tmp_path / "run"
    overrides = [
        *tiny_overrides,
        *QUICK,
        f"run_dir={run_dir}",
        f"data.prepared_dir={tmp_path / 'prepared'}",
        "trainer.checkpoint_every=1000000",
    ]
    process = subprocess.Popen(
        [str(BIN / "tmt-train"), *overrides, "trainer.max_steps=1000000"],
        stderr=subprocess.PIPE,
        text=True,
        # SIGHUP as a terminal leaves it: under `nohup` (a CI job's) the run keeps it ignored,
        # as nohup asks (train/signals.py), and would never stop
        preexec_fn=default_hangup,
    )
    for line in process.stderr:
        if "the first update took" in line:  # an update is done; more follow
            break
    process.send_signal(stop_signal)
    stderr = process.stderr.read()
    assert process.wait(timeout=60) == 0, stderr
    name = signal.Signals(stop_signal).name
    assert f"stop signal ({name})" in stderr
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] > 0 and f"after {state['step']} updates" in stderr

    resumed = subprocess.run(
        [str(BIN / "tmt-train"), *overrides, f"trainer.max_steps={state['step'] + 2}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"at update {state['step']}" in resumed.stderr
    final = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert final["step"] == state["step"] + 2


@pytest.mark.slow
def test_average_the_newest_checkpoints_then_evaluate_them(tiny_train_job):
    last = train(tiny_train_job("trainer.max_steps=6", "trainer.checkpoint_every=2", *QUICK))
    run_dir = last.parents[1]
    result = subprocess.run(
        [str(BIN / "tmt-average"), f"run_dir={run_dir}", "last=3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    averaged = torch.load(run_dir / "checkpoints" / "averaged.pt", weights_only=True)
    assert averaged["averaged_from"] == ["step_2.pt", "step_4.pt", "step_6.pt"]
    job = compose_job("eval", [f"run_dir={run_dir}", "checkpoint=averaged.pt", "decode=greedy"])
    assert evaluate(job).checkpoint["checkpoint"].endswith("checkpoints/averaged.pt")

    too_many = subprocess.run(
        [str(BIN / "tmt-average"), f"run_dir={run_dir}", "last=9"], capture_output=True, text=True
    )
    assert too_many.returncode == 2 and "only 3" in too_many.stderr
    assert "Traceback" not in too_many.stderr


def test_a_log_line_every_log_every_updates_and_no_bar_outside_a_terminal(tiny_overrides, tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [str(BIN / "tmt-train"), *tiny_overrides, *QUICK, f"run_dir={run_dir}"]
        + [f"data.prepared_dir={tmp_path / 'prepared'}", "trainer.max_steps=4"]
        + ["trainer.log_every=2", "trainer.progress_bar=true"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    line = (
        r"update {} epoch 0 loss=[\d.]+ nll=[\d.]+ ppl=[\d.]+ lr=[\d.e+-]+ gnorm=[\d.]+ "
        r"tok/s=\d+ data=[\d.]+% elapsed=[\d.]+min$"
    )
    for step in (2, 4):
        assert re.search(line.format(step), result.stderr, re.MULTILINE), result.stderr
        assert re.search(line.format(step), (run_dir / "train.log").read_text(), re.MULTILINE)
    assert "\r" not in result.stderr  # stderr is a pipe here: no progress bar
