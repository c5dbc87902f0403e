"""The FLOP count behind MFU: each matmul charged to the positions it runs on, real tokens
counted apart from padding, both shown where MFU is logged; and which peak a GPU's name gets
(the specific name before one it contains)."""

import numpy as np
import pytest
import torch

from transformer_mt.config import ModelConfig
from transformer_mt.data.batching import Batch, pad_sequences
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.model import Transformer
from transformer_mt.train.flops import Flops, batch_flops, peak_flops, step_flops, update_flops
from transformer_mt.train.monitor import StepStats, ThroughputWindow, WindowStats


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),  # matched "H100" (989) before
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),  # matched "H200" before
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA H800", 989e12),
        ("NVIDIA B200", 2250e12),
        ("NVIDIA GB200", None),  # not given B200's figure
        ("NVIDIA L40S", 362e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("Tesla T4", None),
    ],
)
def test_a_device_name_gets_its_own_peak(name, peak):
    assert peak_flops(name) == peak


# ---- the count -----------------------------------------------------------------------------
TINY = ModelConfig(d_model=16, n_heads=2, d_ff=24, n_encoder_layers=2, n_decoder_layers=3)
VOCAB = 50


def linear_flops_of_the_model(src_positions: int, tgt_positions: int) -> float:
    """6 x multiply-adds of every nn.Linear of the real model on the positions it runs on (the
    encoder's and the cross-attention's key/value projection on source positions), plus the
    tied output projection on target positions: counted from the module tree, not the formula."""
    model = Transformer(TINY, vocab_size=VOCAB, pad_id=PAD_ID)
    total = 6.0 * tgt_positions * TINY.d_model * VOCAB
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            on_source = name.startswith("encoder.") or name.endswith("cross_attn.kv")
            positions = src_positions if on_source else tgt_positions
            total += 6.0 * positions * module.in_features * module.out_features
    return total


def test_the_count_charges_each_matmul_to_the_positions_it_runs_on():
    src, tgt = 7, 11  # the cross-attention's keys and values run on the 7 source positions
    d, n_enc, n_dec = TINY.d_model, TINY.n_encoder_layers, TINY.n_decoder_layers
    attention = 6.0 * 2 * d * (n_enc * src * src + n_dec * (tgt * tgt + tgt * src))
    counted = step_flops(TINY, VOCAB, [src], [tgt])
    assert counted == pytest.approx(linear_flops_of_the_model(src, tgt) + attention, rel=1e-12)


def collated(sentences: list[tuple[int, int]]) -> Batch:
    """A batch of pairs of these (source, target) lengths, right-padded as collate does."""
    src = pad_sequences([np.full(s, 7) for s, _ in sentences], PAD_ID, suffix=EOS_ID)
    tgt_in = pad_sequences([np.full(t, 7) for _, t in sentences], PAD_ID, prefix=BOS_ID)
    tgt_out = pad_sequences([np.full(t, 7) for _, t in sentences], PAD_ID, suffix=EOS_ID)
    real = sum(t + 1 for _, t in sentences)
    return Batch(src, tgt_in, tgt_out, real, sum(s + 1 for s, _ in sentences))


def test_real_token_flops_leave_padding_out_and_padded_flops_count_it():
    pairs = [(20, 25), (4, 6), (11, 3)]
    flops = batch_flops(TINY, VOCAB, collated(pairs), PAD_ID)
    alone = [batch_flops(TINY, VOCAB, collated([pair]), PAD_ID) for pair in pairs]
    # Real tokens: the batch is the sum of its sentences, whatever padding they got together.
    assert flops.real == pytest.approx(sum(one.real for one in alone), rel=1e-12)
    assert all(one.real == one.padded for one in alone)  # one sentence: nothing padded
    widest = batch_flops(TINY, VOCAB, collated([(20, 25)] * 3), PAD_ID)
    assert flops.padded == widest.padded and flops.real < flops.padded
    summed = update_flops(TINY, VOCAB, [collated(pairs), collated(pairs[:1])], PAD_ID)
    assert summed == flops + alone[0]


def an_update() -> StepStats:
    return StepStats(
        loss=torch.tensor(2.0),
        nll=torch.tensor(1.5),
        lr=1e-3,
        grad_norm=torch.tensor(0.5),
        tokens=1000.0,
        padding=0.2,
        flops=Flops(real=4e12, padded=5e12),
    )


def test_the_log_line_gives_mfu_on_real_tokens_beside_padded():
    step = an_update()
    stats = WindowStats.of([step, step], seconds=2.0, peak_flops=1e13)
    assert (stats.mfu, stats.mfu_padded, stats.tflops_per_s) == (0.4, 0.5, 4.0)
    assert " mfu=0.400 mfu_padded=0.500 " in stats.format(step=2, epoch=0, elapsed_seconds=1.0)
    assert {"mfu", "mfu_padded"} <= stats.scalars().keys()


def test_the_log_line_gives_the_share_of_time_spent_waiting_for_data():
    window = ThroughputWindow()
    window.add(an_update(), waited=0.25)
    window.add(an_update(), waited=0.25)
    stats = WindowStats.of(window.updates, seconds=2.0, peak_flops=None, waited=window.waited)
    assert stats.data_wait == 0.25 and stats.scalars()["data_wait"] == 0.25
    assert " data=25.0% " in stats.format(step=2, epoch=0, elapsed_seconds=1.0)
