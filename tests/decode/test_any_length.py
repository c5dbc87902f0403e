"""Sentences of any length: the position table grows on demand, its rows inside the configured
table stay bitwise the old ones, and a line far longer than the table translates whole."""

import math

import numpy as np
import torch

from transformer_mt.data.batching import pad_sequences
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer_mt.decode.search import beam_search, greedy_search
from transformer_mt.model import sinusoidal_table

POSITIONS = 24  # the toy models' table: 23 source pieces + EOS


def old_sinusoidal_table(max_positions: int, d_model: int) -> torch.Tensor:
    """The table as model.py computed it before it could grow (a verbatim copy)."""
    position = torch.arange(max_positions, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


def embed(model, length: int) -> torch.Tensor:
    tokens = torch.full((1, length), 5, dtype=torch.long)
    return model.embed_tokens(tokens, model.embed)


def test_the_table_grows_and_keeps_the_old_rows_bitwise(random_model):
    model = random_model(50, 0, max_positions=POSITIONS)
    old = old_sinusoidal_table(POSITIONS, model.cfg.d_model)
    assert torch.equal(model.positions, old)
    before = embed(model, POSITIONS)
    after = embed(model, 3 * POSITIONS + 5)  # grows the table, in whole blocks
    assert model.positions.shape[0] == 4 * POSITIONS
    assert torch.equal(model.positions[:POSITIONS], old)
    assert torch.equal(after[:, :POSITIONS], before)  # in-table positions embed as before
    assert "positions" not in model.state_dict()  # checkpoints do not change
    # Rows past the old table are the same sinusoids (float32: sin of arguments up to ~100
    # rounds within 1e-5), and the same bitwise however the table got there.
    exact = sinusoidal_table(4 * POSITIONS, model.cfg.d_model)
    assert torch.allclose(model.positions, exact, atol=1e-5, rtol=0)
    stepwise = random_model(50, 0, max_positions=POSITIONS)
    for length in (30, 50, 3 * POSITIONS + 5):
        embed(stepwise, length)
    assert torch.equal(stepwise.positions, model.positions)


def test_in_table_outputs_do_not_change_after_a_long_sentence(random_model):
    model = random_model(50, 1, max_positions=POSITIONS, eos_bonus=4.0)
    rng = np.random.default_rng(0)
    short = pad_sequences([rng.integers(4, 50, size=n) for n in (5, 9, 14)], PAD_ID, suffix=EOS_ID)
    ids = {"bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID, "max_len_b": 5}
    greedy_before = greedy_search(model, short, **ids)
    beam_before = beam_search(model, short, beam_size=3, **ids)
    long = pad_sequences([rng.integers(4, 50, size=200)], PAD_ID, suffix=EOS_ID)
    greedy_search(model, long, **ids)
    assert model.positions.shape[0] > 200
    assert greedy_search(model, short, **ids) == greedy_before
    assert beam_search(model, short, beam_size=3, **ids) == beam_before
