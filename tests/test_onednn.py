"""oneDNN's product for training on the CPU (transformer_mt/onednn.py, trainer.cpu_linear): the
same values and gradients as F.linear up to float32 rounding, chosen by the execution policy only
where it applies, put in a copy of the model over the model's own parameters, and the trainer's
setting reaching the call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from toy_runs import trainer_for

from transformer_mt import onednn
from transformer_mt.config import CpuLinear, ModelConfig, Precision, TrainerConfig
from transformer_mt.data.prepare import prepare
from transformer_mt.data.tokenizer import PAD_ID
from transformer_mt.execution import ExecutionPolicy, LossChunks
from transformer_mt.model import Transformer
from transformer_mt.train.loss import projected_loss
from transformer_mt.train.start import STEERING_KEYS

pytestmark = pytest.mark.skipif(not onednn.available(), reason="this torch has no oneDNN")


def leaves(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=generator).requires_grad_() for shape in shapes]


def product_and_gradients(relu: bool, by_onednn: bool):
    x, weight, bias = leaves((3, 37, 64), (96, 64), (96,))
    if by_onednn:
        layer = onednn.TrainingLinear.over(nn.Linear(64, 96))
        layer.weight, layer.bias = nn.Parameter(weight), nn.Parameter(bias)
        y = layer(x, relu=relu)
        weight, bias = layer.weight, layer.bias
    else:
        y = F.linear(x, weight, bias)
        y = F.relu(y) if relu else y
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


@pytest.mark.parametrize(
    ("settings", "device", "products"),
    [
        ({}, "cpu", CpuLinear.onednn),
        ({"cpu_linear": CpuLinear.torch}, "cpu", CpuLinear.torch),
        ({"precision": Precision.bf16}, "cpu", CpuLinear.torch),  # under autocast
        ({"compile": "true"}, "cpu", CpuLinear.torch),  # torch.compile traces F.linear
        ({}, "cuda", CpuLinear.torch),
    ],
)
def test_the_policy_takes_onednn_for_float32_eager_training_on_the_cpu(settings, device, products):
    policy = ExecutionPolicy.for_training(TrainerConfig(**settings), torch.device(device))
    assert policy.cpu_products == products


def test_the_kernels_go_into_a_copy_over_the_models_own_parameters():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1)
    model = Transformer(cfg, vocab_size=30, pad_id=PAD_ID)
    onednn_policy = ExecutionPolicy.for_training(TrainerConfig(), torch.device("cpu"))
    copied = onednn_policy.with_kernels(model)
    layers = [m for m in copied.modules() if isinstance(m, nn.Linear)]
    assert layers and all(type(m) is onednn.TrainingLinear for m in layers)
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))
    assert {id(p) for p in copied.parameters()} == {id(p) for p in model.parameters()}
    src = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]])
    tgt = torch.tensor([[2, 5, 6], [2, 8, 0]])
    torch.testing.assert_close(copied.eval()(src, tgt), model.eval()(src, tgt))
    torch_policy = ExecutionPolicy.for_training(
        TrainerConfig(cpu_linear=CpuLinear.torch), torch.device("cpu")
    )
    assert torch_policy.with_kernels(model) is model


def loss_and_gradients(by_onednn: bool):
    hidden, weight = leaves((4, 9, 32), (50, 32), seed=2)
    target = torch.randint(3, 50, (4, 9), generator=torch.Generator().manual_seed(3))
    target[1, 6:] = 0  # padding
    chunks = LossChunks(tokens=7, drop_padding=True, by_onednn=by_onednn)
    sums = projected_loss(hidden, weight, target, epsilon=0.1, pad_id=0, chunks=chunks)
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
    trainer = trainer_for(job, data)
    trainer.metrics.close()
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
