"""A training run's device set-up and its update's gradients, on the CPU where a GPU is not at
hand: the GPU asked for by index made the current one, TF32 for fp32 matrix products, the
gradients as views of DistributedDataParallel's buckets, and clipping that is off rescaling
nothing. One test (marker `gpu`) checks the set-up on a real GPU."""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from toy_runs import trainer_for

from transformer_mt import device as process_setup
from transformer_mt.data.prepare import prepare
from transformer_mt.device import ALLOCATOR_SETTINGS
from transformer_mt.train import distributed
from transformer_mt.train.distributed import Ranks, start_ranks
from transformer_mt.train.trainer import Trainer

QUICK = ["trainer.valid_every=0", "trainer.valid_bleu_sentences=0", "trainer.log_every=1"]


@pytest.fixture
def fake_gpus(monkeypatch):
    """start_ranks on this CPU machine as on one with GPUs: resolve_device answers the device
    asked for, torch.cuda.set_device records its argument (the list returned), and the TF32
    setting starts off and is put back after the test."""
    calls: list[torch.device] = []
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(distributed, "resolve_device", torch.device)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    matmul = torch.backends.cuda.matmul
    before, matmul.allow_tf32 = matmul.allow_tf32, False
    yield calls
    matmul.allow_tf32 = before


def test_a_gpu_given_by_index_becomes_the_current_one_with_tf32_matmuls(fake_gpus, caplog):
    with caplog.at_level(logging.INFO, logger="transformer_mt"):
        ranks, device = start_ranks("cuda:1")
        start_ranks("cuda:1")  # a second run in the same process
    assert device == torch.device("cuda", 1) and not ranks.distributed
    assert fake_gpus == [torch.device("cuda", 1)] * 2
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.backends.cuda.matmul.allow_tf32  # the setting torch.compile reads, readable
    assert caplog.text.count("fp32 matrix products in TF32") == 1  # logged once


def test_a_run_on_the_cpu_gets_its_threads_and_malloc_setting_as_decoding_does(
    fake_gpus, monkeypatch
):
    """Training's ranks set their process up as loading a translator does: one
    device.prepare_process (trainer.num_threads, glibc's malloc keeping freed memory)."""
    calls = []
    monkeypatch.setattr(process_setup, "keep_freed_host_memory", lambda: calls.append("malloc"))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(("threads", n)))
    start_ranks("cpu", threads=3)
    assert calls == [("threads", 3), "malloc"]
    calls.clear()
    process_setup.prepare_process(torch.device("cpu"), keep_freed_memory=False)  # a library user
    assert calls == []


def test_cuda_without_an_index_and_the_cpu_keep_the_current_device(fake_gpus):
    start_ranks("cpu")
    assert torch.get_float32_matmul_precision() == "highest"  # the CPU changes nothing
    start_ranks("cuda")
    assert fake_gpus == []
    assert torch.get_float32_matmul_precision() == "high"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")
def test_on_a_gpu_a_run_gets_its_device_tf32_and_expandable_segments():
    # A fresh process: the allocator reads its settings once, when CUDA starts.
    script = (
        "import json, torch\n"
        "from transformer_mt.train.distributed import start_ranks\n"
        "ranks, device = start_ranks('cuda:0')\n"
        "x = torch.ones(1 << 20, device=device)\n"
        "segments = torch.cuda.memory._snapshot()['segments']\n"
        "print(json.dumps({'current': torch.cuda.current_device(),\n"
        "    'tf32': torch.backends.cuda.matmul.allow_tf32,\n"
        "    'precision': torch.get_float32_matmul_precision(),\n"
        "    'expandable': [s.get('is_expandable') for s in segments]}))\n"
    )
    environ = {k: v for k, v in os.environ.items() if k not in (*ALLOCATOR_SETTINGS, "WORLD_SIZE")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["current"] == 0 and seen["tf32"] and seen["precision"] == "high", seen
    assert seen["expandable"] and all(seen["expandable"]), seen


class OneRankWorld(Ranks):
    """A world of one rank that still trains through DistributedDataParallel."""

    @property
    def distributed(self) -> bool:
        return True


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    try:
        yield OneRankWorld(control=dist.group.WORLD)
    finally:
        dist.destroy_process_group()


def built_trainer(job, data, ranks: Ranks | None = None) -> Trainer:
    torch.manual_seed(job.trainer.seed)  # the same initial parameters
    trainer = trainer_for(job, data, ranks=ranks)
    trainer.metrics.close()
    return trainer


def first_updates(trainer: Trainer, count: int) -> list[list]:
    stream = trainer.micro_batches()
    return [
        [batch for batch, _ in itertools.islice(stream, trainer.plan.accumulation)]
        for _ in range(count)
    ]


def test_ddp_gradients_stay_views_of_its_buckets_and_train_as_one_process(
    tiny_train_job, one_rank_group
):
    # Micro-batches of at most 600 tokens: 2 or more per update, so DDP's no_sync accumulation
    # runs into the bucket views too.
    job = tiny_train_job(*QUICK, "trainer.batch_tokens=600")
    data = prepare(job.data)
    plain, ddp = built_trainer(job, data), built_trainer(job, data, one_rank_group)
    assert ddp.plan.accumulation >= 2
    assert ddp.train_model.gradient_as_bucket_view
    updates = first_updates(plain, 4)
    torch.manual_seed(5)  # the same dropout masks in both runs
    for batches in updates:
        plain.train_step(batches)
    torch.manual_seed(5)
    storage = []
    for batches in updates:
        ddp.train_step(batches)
        grads = [parameter.grad for parameter in ddp.model.parameters()]
        # Kept between updates, zeroed, in the same memory: DDP's buckets, not copies of them
        # (from the second update on: DDP rebuilds its buckets once, after the first).
        assert all(grad is not None and not grad.any() for grad in grads)
        storage.append([grad.data_ptr() for grad in grads])
    assert storage[1] == storage[2] == storage[3]
    for (name, one), two in zip(
        plain.model.state_dict().items(), ddp.model.state_dict().values(), strict=True
    ):
        assert torch.equal(one, two), name


@pytest.mark.parametrize(("clip", "rescaled"), [(0.0, False), (1.0, True)])
def test_clipping_off_measures_the_gradient_norm_without_rescaling(
    tiny_train_job, monkeypatch, clip, rescaled
):
    job = tiny_train_job(*QUICK, f"optim.clip_norm={clip}")
    trainer = built_trainer(job, prepare(job.data))
    (batches,) = first_updates(trainer, 1)
    multiplied = []
    foreach_mul = torch._foreach_mul_

    def counted_mul(*args, **kwargs):
        multiplied.append(len(args[0]))
        return foreach_mul(*args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_mul_", counted_mul)
    stats = trainer.train_step(batches)
    assert bool(multiplied) == rescaled  # clip_grad_norm_ multiplies even by min(inf / norm, 1)
    assert torch.isfinite(stats.grad_norm) and stats.grad_norm > 0
