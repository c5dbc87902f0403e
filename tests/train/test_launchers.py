"""Ranks from the launchers that are not torchrun (Slurm's srun, in an sbatch script or under
Hydra's submitit_slurm launcher; submitit's local executor), and a stop signal handed on to the
launcher's own handler once the checkpoint is written (submitit requeues the job from it).
The trainings themselves: tests/train/test_distributed.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_mt.commands.train import train
from transformer_mt.errors import ConfigError, TransformerMTError
from transformer_mt.launch import (
    first_host,
    port_of,
    rank_variables,
    tasks_per_node,
    unused_slurm_tasks,
    world_size,
)
from transformer_mt.run_dir import RunDir
from transformer_mt.train import signals
from transformer_mt.train.distributed import cuda_index, start_ranks
from transformer_mt.train.trainer import Trainer

# What srun gives task 3 of a step of 4 tasks over 2 nodes (2 each), in job 4242.
SRUN_TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NODELIST": "gpu[007-008]",
    "SLURM_JOB_NODELIST": "gpu[007-008]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
}


def test_slurm_tasks_of_a_step_are_ranks_with_rank_0_on_the_first_node():
    variables, launcher = rank_variables(SRUN_TASK)
    assert launcher == "Slurm (srun)"
    assert variables == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "gpu007",
        "MASTER_PORT": str(port_of("4242.0")),
    }
    assert world_size(SRUN_TASK) == 4  # what trainer=scaled multiplies by
    mine = rank_variables({**SRUN_TASK, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"})[0]
    assert (mine["MASTER_ADDR"], mine["MASTER_PORT"]) == ("10.0.0.1", "29400")
    # torchrun's own variables win: torchrun started inside a Slurm job.
    assert rank_variables({**SRUN_TASK, "WORLD_SIZE": "8"}) == ({}, "torchrun")


def test_the_batch_script_itself_is_one_process_not_a_rank_waiting_for_others():
    batch = {k: v for k, v in SRUN_TASK.items() if not k.startswith("SLURM_STEP")}
    batch.update(SLURM_PROCID="0", SLURM_LOCALID="0")
    assert rank_variables(batch) == ({}, "none") and world_size(batch) == 1
    assert unused_slurm_tasks(batch) == 4  # start_ranks warns: start it with srun
    with pytest.raises(TransformerMTError, match="SLURM_NTASKS='4x' is not a whole number"):
        unused_slurm_tasks({**batch, "SLURM_NTASKS": "4x"})
    assert unused_slurm_tasks(SRUN_TASK) == 0
    one_task = {**SRUN_TASK, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}
    assert rank_variables(one_task) == ({}, "none")


def test_submitit_local_tasks_are_ranks_on_this_machine():
    task = {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_NTASKS": "2",
        "SUBMITIT_LOCAL_GLOBALID": "1",
        "SUBMITIT_LOCAL_LOCALID": "1",
        "SUBMITIT_LOCAL_JOB_ID": "31337",
    }
    variables, launcher = rank_variables(task)
    assert launcher == "submitit's local executor"
    assert variables == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port_of("31337")),
    }
    assert 20_000 <= port_of("31337") < 60_000


def without(environ: dict[str, str], name: str) -> dict[str, str]:
    return {key: value for key, value in environ.items() if key != name}


SUBMITIT_TASK = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "2"}
# Review t6, C5: launcher variables that no launcher gives, each of which waited out
# trainer.rank_timeout_minutes, or failed with a traceback (KeyError, ValueError).
INCONSISTENT = [
    ({**SRUN_TASK, "SLURM_PROCID": "5"}, "SLURM_PROCID=5 is not below SLURM_STEP_NUM_TASKS=4"),
    (without(SRUN_TASK, "SLURM_PROCID"), "SLURM_PROCID is not set: srun sets it"),
    ({**SRUN_TASK, "SLURM_STEP_NUM_TASKS": "two"}, "SLURM_STEP_NUM_TASKS='two' is not a whole"),
    ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"}, "SLURM_STEP_NODELIST='': no node"),
    ({**without(SRUN_TASK, "SLURM_JOB_ID")}, "SLURM_JOB_ID is not set (rank 0's port"),
    (SUBMITIT_TASK, "SUBMITIT_LOCAL_GLOBALID is not set: submitit's local executor sets it"),
    ({**SUBMITIT_TASK, "SUBMITIT_LOCAL_GLOBALID": "2"}, "SUBMITIT_LOCAL_GLOBALID=2 is not below"),
]


@pytest.mark.parametrize("environ,said", INCONSISTENT)
def test_inconsistent_launcher_variables_are_one_line_naming_the_variable(environ, said):
    with pytest.raises(TransformerMTError) as refused:
        rank_variables(environ)
    assert said in str(refused.value) and "\n" not in str(refused.value)


LAUNCH_VARIABLES = (
    *SRUN_TASK, "SLURM_JOB_NODELIST", "SUBMITIT_EXECUTOR", "SUBMITIT_LOCAL_NTASKS",
    "SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_LOCALID", "SUBMITIT_LOCAL_JOB_ID", "RANK",
    "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "GLOO_SOCKET_IFNAME",
)  # fmt: skip


def launched_as(monkeypatch, environ: dict[str, str]) -> None:
    """This process's environment: `environ`'s launcher variables, no others; restored after
    the test (start_ranks adds torchrun's)."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.setenv(name, "")  # so that the deletion below is undone after the test
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)


def test_a_slurm_node_that_does_not_resolve_is_one_line_before_any_wait(monkeypatch):
    task = {**SRUN_TASK, "SLURM_STEP_NODELIST": "nosuchnode[1-2].invalid", "SLURM_PROCID": "1"}
    launched_as(monkeypatch, task)
    with pytest.raises(TransformerMTError) as refused:
        start_ranks("cpu", timeout_minutes=30)
    message = str(refused.value)
    assert message.startswith("MASTER_ADDR=nosuchnode1.invalid, rank 0's address (Slurm (srun)")
    assert "SLURM_STEP_NODELIST" in message and "\n" not in message


def test_a_rank_whose_others_never_come_is_one_line_after_the_rank_timeout(monkeypatch):
    """Slurm's variables for rank 0 of 2, complete, but no rank 1: the wait of
    trainer.rank_timeout_minutes (here 0.05, 3 s) ends in one line, not a DistStoreError."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    task = {**SRUN_TASK, "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    task.update(SLURM_NODEID="0", SLURM_STEP_NODELIST="localhost", MASTER_PORT=str(port))
    launched_as(monkeypatch, task)
    with pytest.raises(TransformerMTError) as refused:
        start_ranks("cpu", timeout_minutes=0.05)
    message = str(refused.value)
    assert message.startswith("rank 0 of 2 did not meet the others at rank 0's store localhost")
    assert "trainer.rank_timeout_minutes=0.05" in message and "\n" not in message


def test_tmt_train_with_an_inconsistent_slurm_task_says_one_line_and_exits_2(tmp_path):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_VARIABLES)}
    environ.update({**SRUN_TASK, "SLURM_PROCID": "5"})
    done = subprocess.run(
        [str(Path(sys.executable).parent / "tmt-train"), "data=toy", "model=tiny",
         f"run_dir={tmp_path / 'run'}", "trainer.rank_timeout_minutes=30"],
        env=environ, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "][ERROR]" in line]
    assert "SLURM_PROCID=5 is not below SLURM_STEP_NUM_TASKS=4" in line
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "nodelist,first",
    [
        ("gpu[003-004,010],cpu1", "gpu003"),
        ("n1,n2", "n1"),
        ("rack[1-2]-node[01-04]", "rack1-node01"),
        ("node7", "node7"),
        ("", None),
    ],
)
def test_the_first_host_of_a_slurm_host_list(nodelist, first):
    assert first_host(nodelist) == first


def test_tasks_per_node_expands_slurms_repeat_counts():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1] and tasks_per_node("8") == [8]


def test_each_rank_takes_its_gpu_or_the_one_gpu_its_slurm_task_was_given():
    assert cuda_index(5, 1, 8, "torchrun") == 1
    assert cuda_index(3, 1, 1, "Slurm (srun)") == 0  # --gpus-per-task=1: each task sees one
    with pytest.raises(ConfigError, match="rank 3 has no GPU: torchrun started at least 2"):
        cuda_index(3, 1, 1, "torchrun")  # two processes on a machine with one GPU


def test_a_stop_signal_goes_on_to_a_launchers_handler_after_the_checkpoint(
    tiny_train_job, monkeypatch
):
    """submitit installs a Python handler for its pre-emption signal (SIGUSR2), which requeues
    the job. The trainer's replaces it while training; SIGUSR2 stops the run with a checkpoint,
    and then submitit's handler is called, once the checkpoint is on disk."""
    job = tiny_train_job(
        "trainer.max_steps=50",
        "trainer.valid_every=0",
        "trainer.log_every=1",
        "trainer.num_threads=1",
    )
    called: list[int] = []
    checkpoints = f"{job.run_dir}/checkpoints"

    def launchers_handler(number, frame):  # as submitit's: it reads the checkpoint, requeues
        called.append(torch.load(f"{checkpoints}/last.pt", weights_only=True)["step"])

    train_step = Trainer.train_step

    def step_then_signal(trainer, *args):
        result = train_step(trainer, *args)
        if trainer.progress.step == 3:
            signal.raise_signal(signal.SIGUSR2)
        return result

    monkeypatch.setattr(Trainer, "train_step", step_then_signal)
    previous = signal.signal(signal.SIGUSR2, launchers_handler)
    try:
        train(job)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert called == [3]  # once, after the checkpoint of update 3


def test_pass_on_leaves_default_handlers_and_ctrl_c_alone(monkeypatch):
    called = []
    monkeypatch.setattr(signal, "getsignal", lambda number: lambda *a: called.append(number))
    signals.pass_on(None)
    signals.pass_on("SIGINT")  # Ctrl-C: the user's stop, not a launcher's
    assert called == []
    signals.pass_on("SIGTERM")
    assert called == [signal.SIGTERM]
    monkeypatch.setattr(signal, "getsignal", lambda number: signal.SIG_DFL)
    signals.pass_on("SIGTERM")  # the default handler would end the process: the run has stopped
    assert called == [signal.SIGTERM]


SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_train.sbatch"
# srun as Slurm runs a step of 2 tasks on one node: each task the command, with Slurm's
# variables; its status the first failure's.
FAKE_SRUN = """#!/bin/bash
while [[ $1 == --* ]]; do shift; done
pids=()
for rank in 0 1; do
    SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=$rank \\
    SLURM_LOCALID=$rank SLURM_NODEID=0 SLURM_STEP_NODELIST=localhost \\
    SLURM_STEP_TASKS_PER_NODE=2 "$@" 2> "task$rank.err" &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || exit 1; done
"""


@pytest.mark.slow
def test_the_sbatch_example_trains_over_srun_tasks_and_requeues_a_stopped_run(
    tiny_overrides, tmp_path
):
    """scripts/slurm_train.sbatch under a stand-in for srun (2 tasks, Slurm's variables only):
    one training of 2 ranks, written by rank 0; a run whose last record is a stop by signal is
    queued again (scontrol requeue), a finished one is not."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text('#!/bin/bash\necho "$@" >> scontrol.calls\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "WORLD_SIZE"))}
    environ.update(PATH=f"{bin_dir}:{environ['PATH']}", SLURM_JOB_ID="77", MASTER_PORT=str(port))
    overrides = [
        *tiny_overrides,
        "trainer.max_steps=2",
        "trainer.valid_every=0",
        "trainer.valid_bleu_sentences=0",
        "trainer.num_threads=1",
        f"data.prepared_dir={tmp_path / 'prepared'}",
    ]

    def sbatch() -> subprocess.CompletedProcess:
        command = ["bash", str(SCRIPT), "run", *overrides]
        return subprocess.run(
            command, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=600
        )

    done = sbatch()
    assert done.returncode == 0, done.stderr + (tmp_path / "task0.err").read_text()
    start, end = RunDir(tmp_path / "run").history()
    assert (start["world_size"], end["how"], end["step"]) == (2, "finished", 2)
    assert "2 ranks from Slurm (srun)" in (tmp_path / "task0.err").read_text()
    assert not (tmp_path / "scontrol.calls").exists()

    # A stop by signal as the last record (the time limit's SIGUSR1): queued again.
    stopped = {**end, "how": "stop signal", "reason": "stop signal (SIGUSR1)"}
    with open(tmp_path / "run" / "history.jsonl", "a") as history:
        history.write(json.dumps(stopped) + "\n")
    (bin_dir / "srun").write_text("#!/bin/bash\nexit 0\n")  # the run has stopped: nothing to do
    done = sbatch()
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "scontrol.calls").read_text() == "requeue 77\n"
