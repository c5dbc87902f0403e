"""Attention as the model calls it, on the kernels our execution policy orders ([auto]: flash,
efficient, math on CUDA) and on the one torch picks by default ([default]), each against the
explicit math kernel (SDPBackend.MATH): forward and backward through our SelfAttention and
CrossAttention with their masks (a boolean keep mask on the keys for the encoder and cross
attention, is_causal for the decoder's self-attention), in fp32 and under bf16 autocast, at
lengths where cuDNN's 128-wide key tiles end half full (64, 192) and where they do not (30, 200).

Which kernel "default" is: on H100/H200 with torch >= 2.9, cuDNN attention for bf16 (it and
flash take no fp32, for which the memory-efficient kernel runs); on the CPU (the check's
rehearsal, GPU_CHECK_REHEARSAL=1) the CPU flash kernel.

Which kernel each call site takes (the last tests): flash for all three in a training step under
the CUDA policy (batches of one source length: no mask), and in a beam search of one source
length; a masked call takes the memory-efficient kernel (benchmarks/gpu_kernels.py prints both).

pytorch#196678 (torch 2.11 to 2.13 on H100/H200): cuDNN's backward returns NaN grad_q when an
explicit attn_mask is passed, the key length % 128 == 64, and a query row's logsumexp is below
ln(FLT_MAX) = -88.7. The last test builds such rows. Where its default case fails, train with
trainer.sdpa_backends=[auto] (ours, the default), the list its other case checks.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.gpu_kernels import SITES, decoding_kernels, training_kernels
from transformer_mt.config import (
    DecodeConfig,
    ModelConfig,
    Precision,
    SdpaBackend,
    SourceLengths,
    TrainerConfig,
)
from transformer_mt.execution import ExecutionPolicy
from transformer_mt.model import CrossAttention, SelfAttention, Transformer

pytestmark = pytest.mark.gpu
LENGTHS = [30, 64, 192, 200]
D_MODEL, HEADS = 256, 4  # head dimension 64, the base and big models' (512 / 8, 1024 / 16)
MATH = [SdpaBackend.math]
OURS = [SdpaBackend.auto]  # flash, efficient, math on CUDA (transformer_mt/execution.py)

# Relative error ||x - reference|| / ||reference|| allowed between two kernels, from the
# arithmetic. fp32: a sum of n products carries at most n u of relative error (u = 2^-24); the
# longest sums here have n <= 256 (1.5e-5), and the memory-efficient kernel multiplies fp32 in
# three TF32 parts (about fp32's accuracy); 1e-4 leaves a factor of 6 over n u, while a mask
# that is ignored moves half the rows by O(1). bf16: the fused kernels round the softmax
# weights to bf16 before multiplying them with V (u = 2^-9 = 2e-3), and the output, the
# gradients and the projections after them are rounded again, a few such errors each; 2^-5
# (3e-2) is 8 u, still 30 times below a wrong mask's error.
TOLERANCE = {"fp32": 1e-4, "bf16": 2**-5}


def keep_mask(length: int, rows: int, device: torch.device) -> Tensor:
    """(rows, length) keep masks of sources of lengths length, length - 3, length // 2, 5:
    the padded batch is `length` long, and no row is empty (each source has its EOS)."""
    lengths = torch.tensor([length, length - 3, length // 2, 5][:rows], device=device)
    return torch.arange(length, device=device)[None, :] < lengths[:, None]


def relative_error(x: Tensor, reference: Tensor) -> float:
    return ((x.float() - reference.float()).norm() / reference.float().norm()).item()


def policy(kernels: list[SdpaBackend], device: torch.device, precision: str = "fp32"):
    """The training step's execution policy with these attention kernels and precision."""
    settings = TrainerConfig(sdpa_backends=kernels, precision=Precision(precision), compile="false")
    return ExecutionPolicy.for_training(settings, device)


def forward_backward(module: torch.nn.Module, call, inputs: list[Tensor], kernels, precision):
    """`call(*inputs)` under `kernels` (and bf16 autocast), backward of a fixed random
    projection of its output: the output and the gradients of the inputs and parameters."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    module.zero_grad(set_to_none=True)
    with policy(kernels, inputs[0].device, precision).forward():
        output = call(*inputs)
    upstream = torch.randn(output.shape, generator=torch.Generator().manual_seed(7))
    (output.float() * upstream.to(output.device)).sum().backward()
    results = {"output": output.detach()}
    results |= {f"grad of input {i}": t.grad for i, t in enumerate(inputs)}
    results |= {f"grad of {name}": p.grad for name, p in module.named_parameters()}
    return results


def assert_default_matches_math(module, call, inputs, precision: str) -> None:
    """Ours ([auto]) and torch's default each match the math kernel."""
    reference = forward_backward(module, call, inputs, MATH, precision)
    for kernels in (OURS, [SdpaBackend.default]):
        got = forward_backward(module, call, inputs, kernels, precision)
        errors = {name: relative_error(got[name], reference[name]) for name in reference}
        nonfinite = [name for name, value in got.items() if not torch.isfinite(value).all()]
        assert not nonfinite, f"non-finite with SDPA kernels {kernels}: {nonfinite}"
        worst = max(errors, key=errors.get)
        assert errors[worst] <= TOLERANCE[precision], (kernels, worst, errors)


@pytest.fixture
def inputs_of(device):
    def make(*shapes: tuple[int, ...]) -> list[Tensor]:
        generator = torch.Generator().manual_seed(3)
        return [torch.randn(shape, generator=generator).to(device) for shape in shapes]

    return make


def attention_module(kind, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return kind(D_MODEL, HEADS, dropout=0.0).to(device)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("length", LENGTHS)
def test_encoder_self_attention_with_its_keep_mask_matches_math(
    device, inputs_of, length, precision
):
    attention = attention_module(SelfAttention, device)
    keep = keep_mask(length, 4, device)
    (x,) = inputs_of((4, length, D_MODEL))
    assert_default_matches_math(attention, lambda h: attention(h, keep=keep), [x], precision)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("length", LENGTHS)
def test_causal_decoder_self_attention_matches_math(device, inputs_of, length, precision):
    attention = attention_module(SelfAttention, device)
    (x,) = inputs_of((4, length, D_MODEL))
    assert_default_matches_math(attention, lambda h: attention(h, causal=True), [x], precision)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("tgt_length", LENGTHS)
@pytest.mark.parametrize("src_length", LENGTHS)
def test_cross_attention_with_the_source_keep_mask_matches_math(
    device, inputs_of, src_length, tgt_length, precision
):
    attention = attention_module(CrossAttention, device)
    keep = keep_mask(src_length, 4, device)
    x, memory = inputs_of((4, tgt_length, D_MODEL), (4, src_length, D_MODEL))

    def call(x: Tensor, memory: Tensor) -> Tensor:
        k, v = attention.memory_kv(memory)  # (B, H, S, Dh) each
        return attention(x, k, v, keep)

    assert_default_matches_math(attention, call, [x, memory], precision)


@pytest.mark.parametrize(
    "kernels",
    [[SdpaBackend.default], OURS],
    ids=["default", "auto"],
)
@pytest.mark.parametrize("length", LENGTHS)
def test_backward_stays_finite_when_a_rows_logits_are_all_below_minus_88(device, length, kernels):
    """pytorch#196678's rows: every logit about -120, so each row's logsumexp is below -88.7,
    through SDPA with our key mask, in bf16 (the dtype cuDNN attention takes). The true
    gradients are finite; grad_q's are a sum that cancels exactly (every key has the same
    large component), so only their finiteness is asserted, and the output's and grad_v's
    closeness to the math kernel in fp32."""
    rows, heads, head_dim = 4, HEADS, D_MODEL // HEADS
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(rows, heads, length, head_dim, generator=generator) * 0.1
    k = torch.randn(rows, heads, length, head_dim, generator=generator) * 0.1
    v = torch.randn(rows, heads, length, head_dim, generator=generator)
    q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(head_dim)  # logits q.k / sqrt(Dh) ~ -120
    mask = keep_mask(length, rows, device)[:, None, None, :]  # (B, 1, 1, S), as the model's
    upstream = torch.randn(rows, heads, length, head_dim, generator=generator).to(device)

    def run(dtype: torch.dtype, chosen: list[SdpaBackend]) -> dict[str, Tensor]:
        leaves = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
        with policy(chosen, device).forward():
            output = F.scaled_dot_product_attention(*leaves, attn_mask=mask)
        (output.float() * upstream).sum().backward()
        grads = {f"grad_{name}": t.grad.float() for name, t in zip("qkv", leaves, strict=True)}
        return {"output": output.detach().float(), **grads}

    got, reference = run(torch.bfloat16, kernels), run(torch.float32, MATH)
    nonfinite = {name: int((~torch.isfinite(t)).sum()) for name, t in got.items()}
    assert not any(nonfinite.values()), (
        f"non-finite values {nonfinite} with sdpa_backends={[b.value for b in kernels]} at "
        f"length {length} (pytorch#196678 where the default is cuDNN's: train with "
        "trainer.sdpa_backends=[auto])"
    )
    for name in ("output", "grad_v"):
        error = relative_error(got[name], reference[name])
        assert error <= TOLERANCE["bf16"], (name, error)


def test_every_attention_call_of_a_training_step_takes_flash(device):
    """Under the training policy's defaults (on CUDA: bf16, [flash, efficient, math], batches of
    one source length): the encoder's self-attention, the decoder's and the cross-attention
    call SDPA with no mask but causality, and SDPA takes flash for each (a masked call would
    take the memory-efficient kernel; benchmarks/gpu_kernels.py prints both)."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=D_MODEL, n_heads=HEADS, d_ff=512, dropout=0.1)
    model = Transformer(cfg, vocab_size=1000, pad_id=0).to(device)
    training = ExecutionPolicy.for_training(TrainerConfig(compile="false"), device)
    assert training.equal_source_lengths == (device.type == "cuda")
    chosen = training_kernels(model, training, training.equal_source_lengths, rows=16)
    assert chosen == {site: {"flash"} for site in SITES}, chosen


@pytest.mark.parametrize("lengths", list(SourceLengths))
def test_a_beam_searchs_decoder_takes_flash_and_with_one_source_length_every_call(lengths):
    """The fixed-shape search's decoder reads the positions written so far, unmasked: flash.
    The encoder and the cross-attention take flash where the batch has one source length
    (decode.source_lengths=equal, auto's on CUDA); in a batch of similar lengths (masked) the
    memory-efficient kernel."""
    cuda = torch.device("cuda", 0)
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=D_MODEL, n_heads=HEADS, d_ff=512)
    model = Transformer(cfg, vocab_size=1000, pad_id=0).to(cuda)
    chosen = decoding_kernels(model, DecodeConfig(source_lengths=lengths), cuda, rows=8)
    masked = "efficient" if lengths == SourceLengths.similar else "flash"
    expected = dict(zip(SITES, ({masked}, {"flash"}, {masked}), strict=True))
    assert chosen == expected, chosen
