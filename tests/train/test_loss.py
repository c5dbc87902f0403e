import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from transformer_mt.config import CpuLinear, Precision, TrainerConfig
from transformer_mt.execution import ExecutionPolicy, LossChunks, loss_chunk_tokens
from transformer_mt.onednn import ROW_STEP
from transformer_mt.train.loss import label_smoothed_loss, projected_loss


def chunks(tokens: int = 1000, drop_padding: bool = True, **settings) -> LossChunks:
    return LossChunks(tokens=tokens, drop_padding=drop_padding, **settings)


def test_label_smoothed_loss_equals_hand_computed_value():
    # One sentence, vocabulary of 3, logits chosen so the probabilities are simple.
    probabilities = torch.tensor([[[0.5, 0.25, 0.25], [0.2, 0.6, 0.2], [0.1, 0.1, 0.8]]])
    logits = probabilities.log()
    target = torch.tensor([[1, 1, 0]])  # the last position is padding (pad_id 0)
    eps = 0.1
    sums = label_smoothed_loss(logits, target, epsilon=eps, pad_id=0)
    # position 0: nll = -log 0.25; smoothed part = eps * mean(-log p) over the 3 classes
    nll0, nll1 = -math.log(0.25), -math.log(0.6)
    uniform0 = -(math.log(0.5) + math.log(0.25) + math.log(0.25)) / 3
    uniform1 = -(math.log(0.2) + math.log(0.6) + math.log(0.2)) / 3
    expected = (1 - eps) * (nll0 + nll1) + eps * (uniform0 + uniform1)
    assert math.isclose(float(sums.loss), expected, rel_tol=1e-6)
    assert math.isclose(float(sums.nll), nll0 + nll1, rel_tol=1e-6)
    assert int(sums.n_tokens) == 2


def test_matches_pytorch_cross_entropy_convention():
    torch.manual_seed(0)
    logits, target = torch.randn(2, 5, 11), torch.randint(1, 11, (2, 5))
    target[1, 3:] = 0
    sums = label_smoothed_loss(logits, target, epsilon=0.1, pad_id=0)
    reference = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), target.flatten(), ignore_index=0, label_smoothing=0.1, reduction="sum"
    )
    torch.testing.assert_close(sums.loss, reference)


def test_no_smoothing_is_plain_nll():
    torch.manual_seed(1)
    logits, target = torch.randn(1, 4, 7), torch.randint(1, 7, (1, 4))
    sums = label_smoothed_loss(logits, target, epsilon=0.0, pad_id=0)
    torch.testing.assert_close(sums.loss, sums.nll)


def plain_and_projected(rows=3, length=7, vocab=23, width=16, epsilon=0.1, seed=0, **settings):
    """The plain loss over F.linear's logits and projected_loss, with both gradients."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, length, width, generator=generator)
    weight = torch.randn(vocab, width, generator=generator) * width**-0.5
    target = torch.randint(1, vocab, (rows, length), generator=generator)
    target[1, length // 2 :] = 0  # padding
    target[2, 1:] = 0
    results = []
    for projected in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if projected:
            sums = projected_loss(
                h, w, target, epsilon=epsilon, pad_id=0, chunks=chunks(**settings)
            )
        else:
            sums = label_smoothed_loss(F.linear(h, w), target, epsilon=epsilon, pad_id=0)
        sums.loss.backward()
        results.append((sums, h.grad, w.grad))
    return results


@pytest.mark.parametrize("drop_padding", [True, False])  # the CPU's way, the GPU's way
@pytest.mark.parametrize("chunk_tokens", [1, 4, 1000])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_projected_loss_equals_the_plain_one_with_its_gradients(
    chunk_tokens, epsilon, drop_padding
):
    (plain, h_plain, w_plain), (ours, h_ours, w_ours) = plain_and_projected(
        epsilon=epsilon, tokens=chunk_tokens, drop_padding=drop_padding
    )
    torch.testing.assert_close(ours.loss, plain.loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(ours.nll, plain.nll, rtol=1e-6, atol=0)
    assert int(ours.n_tokens) == int(plain.n_tokens) == 3 * 7 - 4 - 6
    torch.testing.assert_close(h_ours, h_plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w_ours, w_plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("drop_padding", [True, False])
def test_projected_loss_gives_padding_no_gradient(drop_padding):
    (_, _, _), (_, h_ours, _) = plain_and_projected(drop_padding=drop_padding)
    assert h_ours[2, 1:].abs().max() == 0 and h_ours[1, 3:].abs().max() == 0
    assert h_ours[0].abs().max() > 0


def test_projected_loss_under_no_grad_gives_the_same_sums_and_computes_no_gradient():
    # Validation: the weight requires a gradient, grad mode is off. Only the forward matmul may
    # run: 2 N D V FLOPs as FlopCounterMode counts them (it leaves out the mean logit's
    # matrix-vector product), not the two gradient matmuls, which would triple it.
    (plain, _, _), _ = plain_and_projected()
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, 16, generator=generator)
    weight = (torch.randn(23, 16, generator=generator) * 16**-0.5).requires_grad_()
    target = torch.randint(1, 23, (3, 7), generator=generator)
    target[1, 3:] = 0
    target[2, 1:] = 0
    with torch.no_grad(), FlopCounterMode(display=False) as flops:
        sums = projected_loss(hidden, weight, target, epsilon=0.1, pad_id=0, chunks=chunks(2))
    torch.testing.assert_close(sums.loss, plain.loss.detach(), rtol=1e-6, atol=0)
    tokens = int(sums.n_tokens)
    assert flops.get_total_flops() == 2 * tokens * 16 * 23


def test_projected_loss_in_bf16_follows_the_plain_one_under_bf16_autocast():
    # Both round the logits' matmul to bf16 and take everything after it in fp32.
    torch.manual_seed(3)
    hidden, weight = torch.randn(4, 9, 32), torch.randn(40, 32) * 32**-0.5
    target = torch.randint(1, 40, (4, 9))
    grads = []
    for projected in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if projected:
                in_bf16 = chunks(5, dtype=torch.bfloat16)
                sums = projected_loss(h, w, target, epsilon=0.1, pad_id=0, chunks=in_bf16)
            else:
                sums = label_smoothed_loss(F.linear(h, w), target, epsilon=0.1, pad_id=0)
        sums.loss.backward()
        grads.append((sums.loss.detach(), h.grad, w.grad))
    (plain, h_plain, w_plain), (ours, h_ours, w_ours) = grads
    assert ours.dtype == torch.float32 and h_ours.dtype == w_ours.dtype == torch.float32
    torch.testing.assert_close(ours, plain, rtol=2e-3, atol=0)
    # bf16 matmuls on both sides (8 bits of mantissa): a few 1e-3 of the largest entry.
    assert (h_ours - h_plain).abs().max() <= 1e-2 * h_plain.abs().max()
    assert (w_ours - w_plain).abs().max() <= 1e-2 * w_plain.abs().max()


@pytest.mark.parametrize(
    ("vocab_size", "expected"),
    [(37000, 512), (8000, 2048), (32000, 512), (10**9, ROW_STEP)],
)
def test_default_chunks_are_whole_row_steps(vocab_size, expected):
    # 2**24 logits per chunk on the CPU, in whole steps of ROW_STEP rows: at 37,000 pieces
    # 453 rows would be padded to 512 for every chunk's products; at least one step.
    chunk = loss_chunk_tokens(torch.device("cpu"), vocab_size)
    assert chunk == expected and chunk % ROW_STEP == 0


CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("settings", "dtype", "by_onednn"),
    [
        ({}, None, True),
        ({"cpu_linear": CpuLinear.torch}, None, False),
        ({"precision": Precision.bf16}, torch.bfloat16, False),
    ],
)
def test_the_policy_gives_the_loss_its_chunks_dtype_and_products(settings, dtype, by_onednn):
    """The loss's way through the tokens is the execution policy's, not the device's or the
    enclosing autocast's: its chunk size, padding dropped first on the CPU, its products'
    dtype and kernel; compiled where the policy compiles its loss (not where it says not to)."""
    policy = ExecutionPolicy.for_training(TrainerConfig(**settings), CPU)
    chunks = policy.loss_chunks(8000)
    assert (chunks.tokens, chunks.drop_padding, chunks.dtype) == (2048, True, dtype)
    assert chunks.by_onednn == (by_onednn and policy.cpu_products == CpuLinear.onednn)
    assert not chunks.compiled
    compiled = dataclasses.replace(policy, compile=True)
    assert compiled.loss_chunks(8000).compiled
    assert not dataclasses.replace(compiled, compile_loss=False).loss_chunks(8000).compiled


def test_an_fp32_policys_loss_stays_fp32_inside_an_enclosing_autocast():
    """Validation's loss can run inside another autocast (a caller's): the products follow the
    policy's dtype (fp32 here), as the plain fp32 loss, not the bf16 around them."""
    (plain, _, _), _ = plain_and_projected()
    generator = torch.Generator().manual_seed(0)  # plain_and_projected's hidden, weight, target
    hidden = torch.randn(3, 7, 16, generator=generator)
    weight = torch.randn(23, 16, generator=generator) * 16**-0.5
    target = torch.randint(1, 23, (3, 7), generator=generator)
    target[1, 3:] = 0
    target[2, 1:] = 0
    fp32 = ExecutionPolicy.for_training(TrainerConfig(cpu_linear=CpuLinear.torch), CPU)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        sums = projected_loss(
            hidden, weight, target, epsilon=0.1, pad_id=0, chunks=fp32.loss_chunks(23)
        )
    torch.testing.assert_close(sums.loss, plain.loss.detach(), rtol=1e-6, atol=0)


@pytest.mark.slow  # torch.compile's code generation on the CPU
def test_compiled_chunks_equal_the_plain_loss_in_fp32_and_within_bf16_rounding():
    # The policy compiles each chunk's passes over its logits where it compiles the model
    # (softmax_terms); in fp32 they equal the plain loss as the eager ones do, and under bf16
    # autocast they stay within bf16's rounding of it, as the eager ones do (test above).
    (plain, h_plain, w_plain), (ours, h_ours, w_ours) = plain_and_projected(
        tokens=4, drop_padding=False, compiled=True
    )
    torch.testing.assert_close(ours.loss, plain.loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(h_ours, h_plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w_ours, w_plain, rtol=1e-5, atol=1e-6)
    generator = torch.Generator().manual_seed(0)  # plain_and_projected's hidden, weight, target
    hidden, weight = (
        torch.randn(3, 7, 16, generator=generator),
        torch.randn(23, 16, generator=generator),
    )
    target = torch.randint(1, 23, (3, 7), generator=generator)
    target[1, 3:] = 0
    target[2, 1:] = 0
    with torch.no_grad():  # validation's graph: no gradient
        sums = projected_loss(
            hidden, weight * 16**-0.5, target, epsilon=0.1, pad_id=0, chunks=chunks(compiled=True)
        )
    torch.testing.assert_close(sums.loss, plain.loss.detach(), rtol=1e-6, atol=0)
    torch.manual_seed(3)
    hidden, weight = torch.randn(4, 9, 32), torch.randn(40, 32) * 32**-0.5
    target = torch.randint(1, 40, (4, 9))
    target[3, 5:] = 0
    results = []
    for compiled in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            in_bf16 = chunks(5, dtype=torch.bfloat16, compiled=compiled)
            sums = projected_loss(h, w, target, epsilon=0.1, pad_id=0, chunks=in_bf16)
        sums.loss.backward()
        results.append((sums.loss.detach(), sums.nll, h.grad, w.grad))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(hidden, weight)
    reference = label_smoothed_loss(logits, target, epsilon=0.1, pad_id=0)
    (eager, eager_nll, h_eager, w_eager), (fused, fused_nll, h_fused, w_fused) = results
    torch.testing.assert_close(fused, reference.loss, rtol=2e-3, atol=0)
    torch.testing.assert_close(fused_nll, reference.nll, rtol=2e-3, atol=0)
    # the same bf16 products on both sides: only fp32 summation order may differ
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=0)
    assert (h_fused - h_eager).abs().max() <= 1e-2 * h_eager.abs().max()
    assert (w_fused - w_eager).abs().max() <= 1e-2 * w_eager.abs().max()
