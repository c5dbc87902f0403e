"""DistributedDataParallel under torchrun (2 CPU processes, gloo) against one process that
accumulates the same global batch; and a 1-process run resumed by 2 processes."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_mt.config import compose_job
from transformer_mt.data.batching import target_fill, token_batches
from transformer_mt.data.prepare import prepare
from transformer_mt.train.run import train

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


@pytest.fixture
def same_batches(tmp_path, tiny_overrides):
    """Overrides under which 1 rank accumulating 4 micro-batches and 2 ranks accumulating 2 see
    the same micro-batches: an even batch count, and a global batch of 4 full micro-batches."""
    base = [
        *tiny_overrides,
        f"data.prepared_dir={tmp_path / 'prepared'}",
        "model.dropout=0",  # ranks draw other dropout masks than one process would
        "trainer.num_threads=1",
        "trainer.valid_every=0",
        "trainer.valid_bleu_sentences=0",
        "trainer.log_every=1",
    ]
    job = compose_job("train", [*base, f"run_dir={tmp_path / 'probe'}"])
    data = prepare(job.data, tmp_path / "probe")
    lengths = data.train.src.lengths, data.train.tgt.lengths
    for budget in range(300, 1500, 7):
        if len(token_batches(*lengths, budget, seed=1, epoch=0)) % 2 == 0:
            break
    global_tokens = math.floor(4 * budget * target_fill(*lengths, budget))
    return [*base, f"trainer.batch_tokens={budget}", f"trainer.global_batch_tokens={global_tokens}"]


def test_two_ddp_processes_equal_one_process_accumulating_the_global_batch(same_batches, tmp_path):
    one = torch.load(
        train(
            compose_job(
                "train", [*same_batches, "trainer.max_steps=3", f"run_dir={tmp_path / 'one'}"]
            )
        ),
        weights_only=True,
    )
    torchrun(2, [*same_batches, "trainer.max_steps=3", f"run_dir={tmp_path / 'two'}"])
    two = torch.load(tmp_path / "two" / "checkpoints" / "last.pt", weights_only=True)
    budget = int(same_batches[-2].split("=")[1])
    assert one["progress"]["layout"] == [1, budget] and two["progress"]["layout"] == [2, budget]
    assert one["step"] == two["step"] == 3
    assert one["progress"]["batch_in_epoch"] == 12 and two["progress"]["batch_in_epoch"] == 6
    for name, tensor in one["model"].items():
        torch.testing.assert_close(two["model"][name], tensor, atol=1e-6, rtol=0, msg=name)
    assert len(two["rng_cpu"]) == 2


def test_a_one_process_run_continues_on_two_ranks(same_batches, tmp_path):
    run_dir = tmp_path / "run"
    train(compose_job("train", [*same_batches, "trainer.max_steps=3", f"run_dir={run_dir}"]))
    result = torchrun(2, [*same_batches, "trainer.max_steps=5", f"run_dir={run_dir}"])
    assert "resuming with another layout" in result.stderr
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == 5 and state["scheduler"]["last_epoch"] == 5
    progress = state["progress"]
    assert progress["layout"][0] == 2
    # 12 of the epoch's batches were used by one process; each rank now holds half the list.
    fraction = 12 / (2 * progress["batches_in_epoch"])
    assert progress["batch_in_epoch"] == round(fraction * progress["batches_in_epoch"]) + 2 * 2
    shutil.rmtree(run_dir / "tensorboard")
