"""The training DataLoader's workers (trainer.loader_workers, train/loader_workers.py): on Linux
they start from a fork server, not as forks of the training process (whose heap they would share
copy-on-write), collate the same batches the trainer would, leave stop signals to the trainer,
and end when the trainer is killed."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from toy_runs import trainer_for

from transformer_mt.data.batching import BatchDataset
from transformer_mt.errors import TransformerMTError
from transformer_mt.train import batches as batches_module
from transformer_mt.train.loader_workers import worker_batches
from transformer_mt.train.signals import STOP_SIGNALS

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fork server is Linux's")


def status_of(pid: int) -> dict[str, str]:
    """/proc/PID/status as a dict; empty once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def ignores(pid: int, sig: int) -> bool:
    return bool(int(status_of(pid)["SigIgn"], 16) >> (sig - 1) & 1)


def test_a_worker_is_not_a_fork_of_the_trainer_and_collates_the_same_batches(tiny_train_job):
    job = tiny_train_job("trainer.loader_workers=1")
    trainer = trainer_for(job)
    trainer.metrics.close()
    loader = trainer.batches.epoch_loader()
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    batches = iter(loader)
    (worker,) = batches._workers
    server = int(status_of(worker.pid)["PPid"])
    assert server != os.getpid()
    # After its first batch: torch's worker loop sets its own SIGTERM handler before it runs
    # worker_init_fn (start_worker), which ignores the stop signals again, so until then a look
    # at the worker can find SIGTERM caught (a race that two busy test processes hit).
    first = next(batches)
    assert all(ignores(pid, sig) for pid in (server, worker.pid) for sig in STOP_SIGNALS)
    from_worker = [first, *batches]
    here = [loader.dataset[index] for index in loader.sampler]
    assert len(from_worker) == len(here) > 1
    for theirs, ours in zip(from_worker, here, strict=True):
        for field in dataclasses.fields(ours):
            mine, expected = getattr(theirs, field.name), getattr(ours, field.name)
            assert torch.equal(torch.as_tensor(mine), torch.as_tensor(expected))


# A process that starts a worker as the trainer does, prints the worker's pid and waits.
TRAINER = textwrap.dedent(
    """
    import time, torch
    from transformer_mt.train.loader_workers import start_worker, worker_context
    numbers = torch.utils.data.TensorDataset(torch.arange(100))
    loader = torch.utils.data.DataLoader(
        numbers, num_workers=1, prefetch_factor=1,
        worker_init_fn=start_worker, multiprocessing_context=worker_context())
    batches = iter(loader)
    next(batches)
    print(batches._workers[0].pid, flush=True)
    time.sleep(600)
    """
)


def test_the_worker_and_its_server_end_when_the_trainer_is_killed():
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(trainer.stdout.readline())
        server = int(status_of(worker)["PPid"])
        assert server != trainer.pid
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    gone = lambda pid: status_of(pid).get("State", "Z").startswith("Z")  # noqa: E731
    deadline = time.monotonic() + 60  # a generous bound: they end within a second here
    while not (gone(worker) and gone(server)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(worker) and gone(server)


class KilledOnThirdBatch(BatchDataset):
    """The trainer's batches; a loader worker that reaches the third is SIGKILLed, as the OOM
    killer would kill it (the worker imports this module to unpickle the dataset)."""

    def __getitem__(self, index):
        if index >= 2 and multiprocessing.parent_process() is not None:  # in the worker only
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


def test_a_worker_killed_by_the_oom_killer_stops_training_with_what_to_do(
    tiny_train_job, monkeypatch
):
    job = tiny_train_job("trainer.loader_workers=1")
    monkeypatch.setattr(batches_module, "BatchDataset", KilledOnThirdBatch)
    trainer = trainer_for(job)
    trainer.metrics.close()
    stream = trainer.batches.micro_batches()
    with pytest.raises(TransformerMTError) as stopped:
        for _ in itertools.islice(stream, 1000):  # a bound, should the worker never die
            pass
    stream.close()
    message = str(stopped.value)
    assert "\n" not in message
    assert message.startswith("a data loader worker ended (killed by SIGKILL): most often the")
    assert "out-of-memory killer" in message and "trainer.loader_workers" in message


class KilledWorker:
    """What a DataLoader iterator holds of a worker that the kernel killed."""

    exitcode = -signal.SIGKILL

    def join(self, timeout=None):
        pass


class ResetWhileHandingOver:
    """A loader iterator whose worker was killed while it handed a batch's shared memory over:
    the connection resets before torch notices that the worker has gone (seen in a suite run)."""

    def __init__(self, workers: list):
        self._workers = workers  # as torch's iterator names them

    def __iter__(self):
        return self

    def __next__(self):
        raise ConnectionResetError(104, "Connection reset by peer")


def test_a_worker_killed_while_it_hands_a_batch_over_stops_training_with_what_to_do():
    with pytest.raises(TransformerMTError) as stopped:
        list(worker_batches(ResetWhileHandingOver([KilledWorker()])))
    assert str(stopped.value).startswith("a data loader worker ended (killed by SIGKILL): most")
    with pytest.raises(ConnectionResetError):  # a reset with every worker alive is not theirs
        list(worker_batches(ResetWhileHandingOver([])))


class ServerGoneWhileStarting:
    """A loader whose fork server ended while it started a worker: multiprocessing reads the
    worker's pid from the server's pipe and finds it closed."""

    def __iter__(self):
        raise EOFError("unexpected EOF")


def test_a_fork_server_that_ends_while_it_starts_a_worker_is_one_line():
    with pytest.raises(TransformerMTError) as stopped:
        list(worker_batches(ServerGoneWhileStarting()))
    message = str(stopped.value)
    assert "\n" not in message
    assert message.startswith("the data loader's fork server ended while it started a worker")
    assert "resumes from the last checkpoint" in message


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:  # gone meanwhile
            continue
        if stat and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def fork_server_of(trainer: subprocess.Popen) -> int | None:
    """The pid of the trainer's fork server once it exists (its command line names it; before
    its exec it is a copy of the trainer); None where the trainer ended first."""
    while trainer.poll() is None:
        for pid in children(trainer.pid):
            with contextlib.suppress(OSError):
                if b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
        time.sleep(0.001)
    return None


@pytest.mark.slow
def test_a_stop_signal_to_the_process_group_as_the_fork_server_starts_saves_and_exits_0(
    tiny_overrides, tmp_path
):
    """Review t6, C1: a SIGTERM to the whole process group (Slurm's, Ctrl-C's) right after the
    fork server appeared, while it still imports torch: the server used to die of it (a 69-line
    EOFError traceback in the trainer, exit 1, no checkpoint). It starts with the stop signals
    held back, so the trainer alone acts on it: a checkpoint and exit 0."""
    command = [
        str(Path(sys.executable).parent / "tmt-train"),
        *tiny_overrides,
        "trainer.loader_workers=2",
        "trainer.max_steps=1000",
        "trainer.valid_every=0",
        "trainer.valid_bleu_sentences=0",
        f"run_dir={tmp_path / 'run'}",
        f"data.prepared_dir={tmp_path / 'prepared'}",
    ]
    trainer = subprocess.Popen(
        command, start_new_session=True, stderr=subprocess.PIPE, text=True
    )  # a process group of its own: the trainer, its fork server and the workers
    try:
        server = fork_server_of(trainer)
        if server is not None:
            os.killpg(trainer.pid, signal.SIGTERM)
        stderr = trainer.communicate(timeout=300)[1]
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    assert server is not None, stderr[-3000:]
    assert trainer.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "stop signal (SIGTERM)" in stderr
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] >= 1
