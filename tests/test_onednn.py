"""oneDNN's product for training on the CPU (transformer_mt/onednn.py, trainer.cpu_linear): the
same values and gradients as F.linear up to float32 rounding, taken only where asked for, and
the trainer's setting reaching the call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer_mt import onednn
from transformer_mt.config import CpuLinear
from transformer_mt.data.prepare import prepare
from transformer_mt.run_dir import RunDir
from transformer_mt.train.loss import projected_loss
from transformer_mt.train.start import STEERING_KEYS
from transformer_mt.train.trainer import Trainer

pytestmark = pytest.mark.skipif(not onednn.available(), reason="this torch has no oneDNN")


def leaves(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=generator).requires_grad_() for shape in shapes]


def product_and_gradients(relu: bool, by_onednn: bool):
    x, weight, bias = leaves((3, 37, 64), (96, 64), (96,))
    with onednn.products_by_onednn(by_onednn):
        y = onednn.linear(x, weight, bias, relu=relu)
    took_onednn = type(y.grad_fn).__name__ == "OneDnnProductBackward"
    upstream = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    return took_onednn, y, *torch.autograd.grad(y, (x, weight, bias), upstream)


@pytest.mark.parametrize("relu", [False, True])
def test_the_product_and_its_gradients_equal_f_linears(relu):
    took_onednn, *ours = product_and_gradients(relu, by_onednn=True)
    took_torch, *reference = product_and_gradients(relu, by_onednn=False)
    assert took_onednn and not took_torch
    if relu:
        assert (reference[0] == 0).any()  # some gradients are cut by the ReLU
    for mine, theirs in zip(ours, reference, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def test_only_float32_eager_products_take_it():
    x, weight = leaves((4, 8), (8, 8))
    assert not onednn.chosen_for(x, weight)  # not asked for
    with onednn.products_by_onednn():
        assert onednn.chosen_for(x, weight)
        assert not onednn.chosen_for(x.double(), weight.double())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not onednn.chosen_for(x, weight)
        with onednn.products_by_onednn(False):
            assert not onednn.chosen_for(x, weight)
        assert onednn.chosen_for(x, weight)  # the inner context restored what it found


def loss_and_gradients(by_onednn: bool):
    hidden, weight = leaves((4, 9, 32), (50, 32), seed=2)
    target = torch.randint(3, 50, (4, 9), generator=torch.Generator().manual_seed(3))
    target[1, 6:] = 0  # padding
    with onednn.products_by_onednn(by_onednn):
        sums = projected_loss(hidden, weight, target, epsilon=0.1, pad_id=0, chunk_tokens=7)
    return sums.loss, sums.nll, *torch.autograd.grad(sums.loss, (hidden, weight))


def test_the_chunked_loss_by_onednn_equals_the_loss_by_torch():
    for mine, theirs in zip(loss_and_gradients(True), loss_and_gradients(False), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("setting", [CpuLinear.onednn, CpuLinear.torch])
def test_the_training_step_multiplies_as_trainer_cpu_linear_says(
    tiny_train_job, monkeypatch, setting
):
    job = tiny_train_job(f"trainer.cpu_linear={setting.value}")
    assert job.trainer.cpu_linear == setting
    data = prepare(job.data)
    trainer = Trainer(job, RunDir(job.run_dir), data, torch.device("cpu"))
    trainer.writer.close()
    onednn.available()  # its one-row probe made before the count starts
    rows = []  # of each product the kernel is given
    product = onednn.packed_product
    monkeypatch.setattr(
        onednn, "packed_product", lambda x, *a, **k: rows.append(len(x)) or product(x, *a, **k)
    )
    assert torch.isfinite(trainer.train_step([next(iter(trainer.epoch_loader()))]).loss)
    assert bool(rows) == (setting == CpuLinear.onednn)
    # In steps of ROW_STEP rows, so that few kernels are made and cached (onednn.py).
    assert all(count % onednn.ROW_STEP == 0 for count in rows)


def test_changing_it_on_resume_is_allowed():
    assert "trainer.cpu_linear" in STEERING_KEYS


def test_f_linear_is_what_it_falls_back_to():
    x, weight = leaves((5, 8), (3, 8))
    torch.testing.assert_close(onednn.linear(x, weight, relu=True), F.relu(F.linear(x, weight)))
