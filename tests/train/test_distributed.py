"""DistributedDataParallel under torchrun and under Hydra's submitit_local launcher (2 CPU
processes, gloo) against one process that accumulates the same global batch; a 1-process run
resumed by 2 processes; two ranks that must agree on when to stop (skewed clocks, a signal that
reaches one rank: Slurm's tasks, resumed bitwise) and do so once every trainer.agree_every
updates, with no collective for the update's token count."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from toy_runs import TINY_TRAIN

from transformer_mt.checkpoint import CheckpointFolder, load_checkpoint
from transformer_mt.commands.train import train
from transformer_mt.config import compose_job
from transformer_mt.data.batching import target_fill, token_batches
from transformer_mt.data.prepare import prepare
from transformer_mt.errors import TransformerMTError
from transformer_mt.launch import port_of
from transformer_mt.run_dir import RunDir
from transformer_mt.train.trainer import Trainer

pytestmark = pytest.mark.slow

TMT_TRAIN = Path(sys.executable).parent / "tmt-train"


def torchrun(nproc: int, overrides: list[str]) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "--no-python",
        str(TMT_TRAIN),
        *overrides,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def same_batches(tmp_path_factory):
    """Overrides under which 1 rank accumulating 4 micro-batches and 2 ranks accumulating 2 see
    the same micro-batches: an even batch count, and a global batch of 4 full micro-batches.
    The corpus is prepared once for the module's tests."""
    tmp_path = tmp_path_factory.mktemp("same_batches")
    base = [
        *TINY_TRAIN,
        f"data.prepared_dir={tmp_path / 'prepared'}",
        "model.dropout=0",  # ranks draw other dropout masks than one process would
        "trainer.num_threads=1",
        "trainer.valid_every=0",
        "trainer.valid_bleu_sentences=0",
        "trainer.log_every=1",
    ]
    job = compose_job("train", [*base, f"run_dir={tmp_path / 'probe'}"])
    data = prepare(job.data)
    lengths = data.train.src.lengths, data.train.tgt.lengths
    for budget in range(300, 1500, 7):
        if len(token_batches(*lengths, budget, seed=1, epoch=0)) % 2 == 0:
            break
    global_tokens = math.floor(4 * budget * target_fill(*lengths, budget))
    return [*base, f"trainer.batch_tokens={budget}", f"trainer.global_batch_tokens={global_tokens}"]


def largest_difference(two: torch.Tensor, one: torch.Tensor) -> tuple[float, float]:
    """(largest |two - one|, largest |one|) of a tensor pair."""
    return (two - one).abs().max().item(), one.abs().max().item()


def submitit_local(ntasks: int, overrides: list[str]) -> subprocess.CompletedProcess:
    """tmt-train as one job of `ntasks` tasks through Hydra's submitit_local launcher."""
    launcher = ["hydra/launcher=submitit_local", f"hydra.launcher.tasks_per_node={ntasks}"]
    command = [str(TMT_TRAIN), "-m", *launcher, "hydra.launcher.timeout_min=10", *overrides]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_two_ranks_under_torchrun_or_submitit_equal_one_process_accumulating_the_global_batch(
    same_batches, tmp_path
):
    # Both runs sum the same per-token gradients in another order (two ranks' halves averaged by
    # DDP against four micro-batches accumulated in one process), so they agree only up to float32
    # rounding: each gradient element is a sum of a few thousand terms, whose rounding error is a
    # few ulps of the largest partial sums (about 1e-7 relative to the tensor's scale each). Adam
    # would turn these last-bit differences into sign flips of near-zero gradients (its first
    # update is lr * sign(g)), so the optimizer is made momentum SGD: with eps far above sqrt(v),
    # Adam's update is lr_scale / eps * lr * m, smooth in the gradient. What is compared is Adam's
    # first moment after 3 updates, 0.1 * (g3 + 0.9 g2 + 0.81 g1): the all-reduced gradients of
    # every update (g2 and g3 also depend on the updates before them). Tolerance: 1e-4 of each
    # tensor's largest value, two to three orders of magnitude above the rounding.
    sgd = [*same_batches, "trainer.max_steps=3", "optim.eps=1000", "optim.lr_scale=1000"]
    sgd.append("trainer.ema_decay=0.5")  # a moving average of the weights, the same on each rank
    one = torch.load(
        train(compose_job("train", [*sgd, f"run_dir={tmp_path / 'one'}"])), weights_only=True
    )
    torchrun(2, [*sgd, f"run_dir={tmp_path / 'two'}"])
    two = torch.load(tmp_path / "two" / "checkpoints" / "last.pt", weights_only=True)
    budget = int(same_batches[-2].split("=")[1])
    assert one["progress"]["layout"] == [1, budget] and two["progress"]["layout"] == [2, budget]
    assert one["step"] == two["step"] == 3
    assert one["progress"]["batch_in_epoch"] == 12 and two["progress"]["batch_in_epoch"] == 6
    worst = 0.0
    for index, state in one["optimizer"]["state"].items():
        moment_two = two["optimizer"]["state"][index]["exp_avg"]
        difference, scale = largest_difference(moment_two, state["exp_avg"])
        assert scale > 0, f"parameter {index} got no gradient"
        assert difference <= 1e-4 * scale, f"parameter {index}: {difference:.3g} of {scale:.3g}"
        worst = max(worst, difference / scale)
    print(f"largest difference: {worst:.3g} of a tensor's largest value")
    assert len(two["rng_cpu"]) == 2
    first, second = two["ema_rank_digests"]  # each rank's digest of its own average
    assert torch.equal(first, second) and two["ema_updates"] == 3
    for name, tensor in one["ema_model"].items():
        if tensor.is_floating_point():
            difference, scale = largest_difference(two["ema_model"][name], tensor)
            assert difference <= 1e-4 * max(scale, 1e-12), name
    # The same two ranks as the tasks of one job of Hydra's submitit_local launcher: one
    # training, in one run folder written by rank 0 alone, equal to torchrun's.
    submitit_local(2, [*sgd, f"run_dir={tmp_path / 'job'}"])
    job = torch.load(tmp_path / "job" / "checkpoints" / "last.pt", weights_only=True)
    assert job["step"] == 3
    assert {**job["progress"], "train_seconds": 0} == {**two["progress"], "train_seconds": 0}
    worst = 0.0
    for index, state in two["optimizer"]["state"].items():
        difference, scale = largest_difference(
            job["optimizer"]["state"][index]["exp_avg"], state["exp_avg"]
        )
        assert difference <= 1e-4 * scale, f"parameter {index}: {difference:.3g} of {scale:.3g}"
        worst = max(worst, difference / scale)
    print(f"submitit against torchrun, largest difference: {worst:.3g}")
    start, end = RunDir(tmp_path / "job").history()  # one start and one end: one writer
    assert start["world_size"] == 2 and end["how"] == "finished"
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == sorted(
        p.name for p in (tmp_path / "two").iterdir()
    )
    assert len(list((tmp_path / "job" / "tensorboard").iterdir())) == 1


def test_a_one_process_run_continues_on_two_ranks_compiled_and_stops_compiling(
    same_batches, tmp_path
):
    # The continuation with trainer.compile=true under DDP (a setting free to change on resume):
    # the model and its loss compiled in each rank, gradients all-reduced through the compiled
    # graph's hooks. The lengths are rounded up to multiples of 8 and the graphs are dynamic, so
    # after the first update's graph no new one is made.
    run_dir = tmp_path / "run"
    train(compose_job("train", [*same_batches, "trainer.max_steps=3", f"run_dir={run_dir}"]))
    compiled = ["trainer.max_steps=10", "trainer.compile=true", f"run_dir={run_dir}"]
    result = torchrun(2, [*same_batches, *compiled])
    assert "resuming with another layout" in result.stderr
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == 10 and state["scheduler"]["last_epoch"] == 10
    progress = state["progress"]
    assert progress["layout"][0] == 2
    # 12 of the epoch's batches were used by one process; each rank now holds half the list,
    # and took 2 micro-batches in each of 7 updates.
    fraction = 12 / (2 * progress["batches_in_epoch"])
    assert progress["batch_in_epoch"] == round(fraction * progress["batches_in_epoch"]) + 7 * 2
    counts = [
        line.split("torch.compile by update ")[1]
        for line in result.stderr.splitlines()
        if "torch.compile by update" in line
    ]
    assert counts, result.stderr[-3000:]
    last_update = int(counts[-1].split(":")[0])
    assert last_update <= 3 + 2, counts  # the counts stopped changing after its second update
    assert "0 recompile(s)" in counts[-1], counts
    shutil.rmtree(run_dir / "tensorboard")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_process(
    rank: int,
    port: int,
    overrides: list[str],
    *,
    clock_speed: float = 1.0,
    sigterm_at: int = 0,
    stop_signal: int = signal.SIGTERM,
    slurm_job: int = 0,
    prepare_delay: float = 0.0,
    extra: tuple[str, ...] = (),
    resume_step: int = 0,
    count_collectives: bool = False,
    fail_at: int = 0,
) -> None:
    """One of two gloo ranks, in a spawned process: trains, then writes the update it stopped at
    and why. `clock_speed` makes this rank's clock run faster; `sigterm_at` sends it
    `stop_signal` after that update (0: never); `slurm_job`: this rank is task `rank` of that
    Slurm job's step as srun starts it (Slurm's variables, none of torchrun's; 0: torchrun's
    variables); `prepare_delay` seconds are added to its data preparation; `extra`:
    overrides of this rank only; `resume_step`: this rank finds step_N.pt as the newest checkpoint
    (as a stale directory listing on its node would); `count_collectives`: see
    count_update_collectives; `fail_at`: this rank raises RuntimeError at that update (0: never).
    An error is written to rankN.error (and, as torchrun asks, to rankN.torchrun.json) beside the
    run folder: a refused command leaves no run folder."""
    if slurm_job:
        os.environ.update(slurm_task(rank, slurm_job))
    else:
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
    if count_collectives:
        count_update_collectives(rank)
    if clock_speed != 1:
        real_clock, start = time.perf_counter, time.perf_counter()
        time.perf_counter = lambda: start + clock_speed * (real_clock() - start)
    fit, train_step, prepare = Trainer.fit, Trainer.train_step, RunDir.prepare

    def fit_and_record(trainer):
        reason = fit(trainer)
        Path(trainer.cfg.run_dir, f"rank{rank}.stopped").write_text(
            f"{trainer.progress.step} {reason}"
        )
        return reason

    def step_then_signal(trainer, *args):
        if trainer.progress.step + 1 == fail_at:
            raise RuntimeError(f"rank {rank} fails at update {fail_at}")
        result = train_step(trainer, *args)
        if trainer.progress.step == sigterm_at:
            os.kill(os.getpid(), stop_signal)
        return result

    def slow_prepare(*args, **kwargs):
        time.sleep(prepare_delay)
        return prepare(*args, **kwargs)

    Trainer.fit, Trainer.train_step, RunDir.prepare = (
        fit_and_record,
        step_then_signal,
        slow_prepare,
    )
    if resume_step:

        def stale_listing(folder):
            path = folder.step_file(resume_step)
            return load_checkpoint(path), path

        CheckpointFolder.newest_readable = stale_listing
    job = compose_job("train", [*overrides, *extra])
    os.environ["TORCHELASTIC_ERROR_FILE"] = str(
        Path(job.run_dir).with_name(f"rank{rank}.torchrun.json")
    )
    try:
        train(job)
    except TransformerMTError as error:
        Path(job.run_dir).with_name(f"rank{rank}.error").write_text(str(error))
        raise


def slurm_task(rank: int, job: int) -> dict[str, str]:
    """The variables srun gives task `rank` of a job step of 2 tasks on one node."""
    return {
        "SLURM_JOB_ID": str(job),
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NODEID": "0",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": "2",
    }


def slurm_job_with_a_free_port() -> int:
    """A Slurm job id whose derived MASTER_PORT (launch.port_of) is free on this machine."""
    for job in range(7000, 8000):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port_of(f"{job}.0")))
            except OSError:
                continue
        return job
    raise AssertionError("no free port among 1,000 Slurm job ids")


COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "gather", "reduce", "barrier")


def count_update_collectives(rank: int) -> None:
    """In this rank's process: count the torch.distributed collectives called from Python while
    the update loop runs (Trainer.run_updates: DDP's gradient all-reduces go through C++ and
    are not among them), check each update's token count against an all-reduce of the collated
    batches' own (not counted), and write rankN.collectives: updates, collectives, mismatches."""
    counts: dict = {"updates": 0, "collectives": 0, "mismatches": []}
    inside = [False]
    real = {name: getattr(dist, name) for name in COLLECTIVES}

    def counting(name: str):
        def collective(*args, **kwargs):
            if inside[0]:
                counts["collectives"] += 1
            return real[name](*args, **kwargs)

        return collective

    for name in COLLECTIVES:
        setattr(dist, name, counting(name))
    run_updates, train_step = Trainer.run_updates, Trainer.train_step

    def counted_loop(trainer):
        inside[0] = True
        try:
            return run_updates(trainer)
        finally:
            inside[0] = False
            Path(trainer.cfg.run_dir, f"rank{rank}.collectives").write_text(json.dumps(counts))

    def checked_step(trainer, batches, update_tokens=None):
        collated = torch.tensor([float(sum(b.n_tgt_tokens for b in batches))], dtype=torch.float64)
        real["all_reduce"](collated, group=trainer.ranks.control)
        if update_tokens != int(collated.item()):
            counts["mismatches"].append([trainer.progress.step, update_tokens, collated.item()])
        counts["updates"] += 1
        return train_step(trainer, batches, update_tokens)

    Trainer.run_updates, Trainer.train_step = counted_loop, checked_step


def run_two_ranks(overrides: list[str], *options: dict, succeed: bool = True) -> None:
    """Ranks 0 and 1 (with rank_process's keyword `options`) must both finish, with exit status
    0 (or both 1 when not `succeed`), within two minutes: ranks that disagree on when to stop
    enter different collectives and hang until the process-group timeout instead."""
    context = multiprocessing.get_context("spawn")
    port = free_port()
    processes = [
        context.Process(target=rank_process, args=(rank, port, overrides), kwargs=kwargs)
        for rank, kwargs in enumerate(options)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    hung = [process.pid for process in processes if process.is_alive()]
    for process in processes:
        if process.is_alive():
            process.kill()
    assert not hung, "ranks did not finish: they disagreed about stopping"
    assert [process.exitcode for process in processes] == [0 if succeed else 1] * 2


def stopped_at(run_dir: Path) -> list[str]:
    return [(run_dir / f"rank{rank}.stopped").read_text() for rank in range(2)]


def test_ranks_with_skewed_clocks_stop_at_the_same_update(same_batches, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        *same_batches,
        "trainer.max_steps=0",
        "trainer.max_time_minutes=0.05",
        f"run_dir={run_dir}",
    ]
    run_two_ranks(overrides, {}, {"clock_speed": 4.0})  # rank 1's clock runs 4x fast
    rank0, rank1 = stopped_at(run_dir)
    assert rank0 == rank1, (rank0, rank1)
    step = int(rank0.split()[0])
    assert "reached trainer.max_time_minutes=0.05" in rank0
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == step  # the final checkpoint, after the final validation
    assert state["progress"]["best_score"] is not None


@pytest.fixture(scope="module")
def agreeing_run(same_batches, tmp_path_factory) -> Path:
    """Two torchrun ranks that agree on when to stop once every 4 updates, for 12 updates, each
    counting its collectives (count_update_collectives): what
    test_ranks_agree_on_stopping_once_every_agree_every_updates_and_count_tokens_alone checks,
    and the never-stopped run that the requeued Slurm job of
    test_slurm_tasks_stop_together_on_a_signal_to_one_and_the_requeued_job_resumes_bitwise must
    equal. No checkpoint inside the loop (a collective)."""
    run_dir = tmp_path_factory.mktemp("agreeing") / "run"
    overrides = [
        *same_batches,
        "trainer.max_steps=12",
        "trainer.agree_every=4",
        "trainer.checkpoint_every=0",  # no checkpoint (a collective) inside the loop
        "trainer.checkpoint_every_minutes=0",
        f"run_dir={run_dir}",
    ]
    run_two_ranks(overrides, {"count_collectives": True}, {"count_collectives": True})
    return run_dir


def test_ranks_agree_on_stopping_once_every_agree_every_updates_and_count_tokens_alone(
    agreeing_run,
):
    for rank in range(2):
        counts = json.loads((agreeing_run / f"rank{rank}.collectives").read_text())
        assert counts["updates"] == 12
        assert counts["mismatches"] == []  # each update's tokens, known without asking
        assert counts["collectives"] <= 12 // 4, counts  # the agreements at updates 4, 8, 12
    assert stopped_at(agreeing_run)[0] == "12 reached trainer.max_steps=12"


def last_state(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def test_slurm_tasks_stop_together_on_a_signal_to_one_and_the_requeued_job_resumes_bitwise(
    same_batches, agreeing_run, tmp_path
):
    """Two ranks from Slurm's variables alone (none of torchrun's), as srun starts the tasks of
    an sbatch script or of Hydra's submitit_slurm launcher. SIGUSR1, Slurm's signal ahead of the
    time limit (--signal=USR1@90), reaches rank 1 first: both stop at their next agreement with
    a checkpoint. The same command again (the requeued job) resumes bitwise: it ends as two
    torchrun ranks that were never stopped (agreeing_run)."""
    agreeing = [*same_batches, "trainer.agree_every=4", "trainer.max_steps=12"]
    run_dir, slurm = tmp_path / "run", {"slurm_job": slurm_job_with_a_free_port()}
    # SIGUSR1 to rank 1 only, after update 5: both go on to update 8, where they next agree.
    signalled = {**slurm, "sigterm_at": 5, "stop_signal": signal.SIGUSR1}
    run_two_ranks([*agreeing, f"run_dir={run_dir}"], slurm, signalled)
    assert stopped_at(run_dir) == ["8 stop signal (on another rank)", "8 stop signal (SIGUSR1)"]
    assert [path.name for path in sorted((run_dir / "checkpoints").glob("step_*.pt"))] == [
        "step_8.pt"
    ]
    assert last_state(run_dir)["step"] == 8
    assert RunDir(run_dir).history()[0]["world_size"] == 2  # one writer: rank 0's records
    # Requeued, the two ranks continue exactly as two that were never stopped.
    run_two_ranks([*agreeing, f"run_dir={run_dir}"], slurm, slurm)
    resumed, straight = last_state(run_dir), last_state(agreeing_run)
    assert resumed["step"] == straight["step"] == 12
    for name, tensor in straight["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
    for index, moments in straight["optimizer"]["state"].items():
        for key, tensor in moments.items():
            assert torch.equal(resumed["optimizer"]["state"][index][key], tensor), (index, key)


def test_ranks_wait_for_a_preparation_longer_than_the_rank_timeout(same_batches, tmp_path):
    # same_batches prepared the corpus into another run folder: this one gets a fresh cache.
    overrides = [
        *same_batches,
        f"data.prepared_dir={tmp_path / 'fresh'}",
        "trainer.max_steps=2",
        "trainer.rank_timeout_minutes=0.15",
        f"run_dir={tmp_path / 'run'}",
    ]
    # 13 s of preparation against a 9 s timeout, which every other wait of this tiny run (the
    # ranks' start, a checkpoint, the final validation: a second or two) stays below even on a
    # loaded machine.
    run_two_ranks(overrides, {"prepare_delay": 0.15 * 60 + 4}, {})
    assert stopped_at(tmp_path / "run")[1].startswith("2 reached trainer.max_steps=2")


def test_ranks_that_would_prepare_different_folders_both_stop_with_the_reason(
    same_batches, tmp_path
):
    # Another data setting on one rank (as another corpus on one node would be): without the
    # check, rank 1 waits for a prepared folder that rank 0 never builds.
    run_dir = tmp_path / "run"
    overrides = [*same_batches, "trainer.max_steps=2", f"run_dir={run_dir}"]
    run_two_ranks(overrides, {}, {"extra": ("data.vocab_size=390",)}, succeed=False)
    for rank in range(2):
        message = run_dir.with_name(f"rank{rank}.error").read_text()
        assert "the ranks planned different starts (prepared folder: rank 0: " in message
        assert "rank 1: " in message
    assert not (run_dir / "checkpoints").exists()  # refused before training


def test_ranks_that_would_resume_different_checkpoints_both_stop(same_batches, tmp_path):
    run_dir = tmp_path / "run"
    first = [*same_batches, "trainer.checkpoint_every=2", f"run_dir={run_dir}"]
    train(compose_job("train", [*first, "trainer.max_steps=4"]))
    run_two_ranks([*first, "trainer.max_steps=6"], {}, {"resume_step": 2}, succeed=False)
    for rank in range(2):
        message = run_dir.with_name(f"rank{rank}.error").read_text()
        assert "(checkpoint: rank 0: " in message and "step_4.pt (update 4)" in message
        assert "step_2.pt (update 2)" in message
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == 4


def test_a_run_folder_in_use_ends_every_rank_of_the_second_job_with_the_reason(
    same_batches, tmp_path
):
    """Review t6, C6: a second 2-rank job (Slurm's variables) on a run folder that another job
    holds. Its rank 0 is refused the folder (in use) and used to leave at once, and rank 1,
    waiting in the start's agreement, ended with a 51-line gloo traceback ("Connection closed
    by peer"). Now rank 0's refusal is part of that agreement: both end with one line, rank 1's
    saying that rank 0 cannot start."""
    run_dir = tmp_path / "run"
    overrides = [*same_batches, "trainer.max_steps=2", f"run_dir={run_dir}"]
    slurm = {"slurm_job": slurm_job_with_a_free_port()}
    with RunDir(run_dir).lock():  # the first job's rank 0 holds it
        run_two_ranks(overrides, slurm, slurm, succeed=False)
    rank0, rank1 = (run_dir.with_name(f"rank{rank}.error").read_text() for rank in range(2))
    assert f"{run_dir} is in use by PID {os.getpid()}" in rank0 and "\n" not in rank0
    assert rank1 == f"rank 0 cannot start, so no rank does: {rank0}"
    assert not (run_dir / "checkpoints").exists()


def test_a_rank_that_fails_ends_both_ranks_at_once_and_every_error_starts_with_its_cause(
    same_batches, tmp_path
):
    """Rank 1 raises at update 3, while rank 0 waits in the update's gradient all-reduce: rank 0
    ends within 60 s of rank 1 (seconds, in fact; without the abort it would wait for
    trainer.rank_timeout_minutes), its error's first line is rank 1's cause, and so is what
    each rank leaves for torchrun to print last."""
    run_dir = tmp_path / "run"
    overrides = [*same_batches, "trainer.max_steps=50", f"run_dir={run_dir}"]
    context, port = multiprocessing.get_context("spawn"), free_port()
    processes = [
        context.Process(target=rank_process, args=(rank, port, overrides), kwargs=kwargs)
        for rank, kwargs in enumerate([{}, {"fail_at": 3}])
    ]
    for process in processes:
        process.start()
    processes[1].join(timeout=300)  # starting up and two updates, on a loaded machine
    processes[0].join(timeout=60)  # the bound once rank 1 has ended
    hung = [process.pid for process in processes if process.is_alive()]
    for process in processes:
        if process.is_alive():
            process.kill()
    assert not hung, "a rank did not end"
    assert [process.exitcode for process in processes] == [1, 1]
    cause = "rank 1 failed: RuntimeError: rank 1 fails at update 3"
    assert run_dir.with_name("rank0.error").read_text().splitlines()[0] == cause
    for rank in range(2):
        said = json.loads(run_dir.with_name(f"rank{rank}.torchrun.json").read_text())["message"]
        assert said["extraInfo"]["py_callstack"] == said["message"] == cause


def test_the_first_failure_is_what_every_rank_reads_and_a_lost_store_leaves_each_its_own(
    monkeypatch,
):
    from transformer_mt.train import distributed

    store = dist.HashStore()  # the rendezvous store, in memory
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    broken = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:4514")
    assert distributed.first_failure(0, broken) is None  # a rank went away without a word
    first = distributed.first_failure(1, ValueError("bad\nsecond line"))
    assert first.line() == "rank 1 failed: ValueError: bad"
    assert distributed.first_failure(0, broken) == first
    assert distributed.first_failure(0, TransformerMTError("refused")) == first

    def gone():
        raise dist.DistNetworkError("Failed to recv, got 0 bytes")

    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", gone)
    mine = distributed.first_failure(0, TransformerMTError("refused"))
    assert mine.line() == "rank 0 failed: refused"
    assert distributed.first_failure(0, broken) is None
