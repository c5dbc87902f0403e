"""The model's Dropout: nn.Dropout's definition, with masks cut from 64-bit draws on the CPU."""

import math

import pytest
import torch

from transformer_mt.model import Dropout

N = 2**20  # elements: a drop rate's standard error over them is sqrt(p (1 - p) / N) < 0.0005


def dropped(p: float, seed: int = 0, n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) of one training-mode call on ones."""
    torch.manual_seed(seed)
    x = torch.ones(n)
    return x, Dropout(p).train()(x)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drops_a_share_p_and_scales_the_rest_by_one_over_one_minus_p(p):
    _, y = dropped(p)
    keep = y != 0
    rate = 1.0 - keep.float().mean().item()
    # 6 standard errors: a seeded draw, so this holds or fails the same on every machine.
    assert abs(rate - p) < 6 * math.sqrt(p * (1 - p) / N)
    assert torch.equal(y[keep], torch.full_like(y[keep], 1.0 / (1.0 - p)))


def test_neighbouring_elements_are_dropped_independently():
    """Four masks come from one 64-bit draw: neighbours must not share their fate (the rate of
    both of two neighbours dropped is p^2, as for independent draws)."""
    p = 0.1
    _, y = dropped(p, seed=3)
    gone = (y == 0).view(-1, 4)  # the four elements of each draw
    for a, b in [(0, 1), (1, 2), (2, 3), (0, 3)]:
        both = (gone[:, a] & gone[:, b]).float().mean().item()
        assert abs(both - p * p) < 6 * math.sqrt(p * p / gone.shape[0])
    across = (gone[:-1, 3] & gone[1:, 0]).float().mean().item()  # the next draw's first
    assert abs(across - p * p) < 6 * math.sqrt(p * p / gone.shape[0])


def test_the_gradient_passes_where_the_forward_kept_scaled_as_the_forward():
    torch.manual_seed(1)
    x = torch.randn(3, 7, 16, requires_grad=True)
    y = Dropout(0.2).train()(x)
    grad = torch.randn_like(y)
    y.backward(grad)
    scale = torch.tensor(1.0 / 0.8)
    assert torch.equal(x.grad, grad * (y != 0) * scale)
    assert torch.equal(y, x.detach() * (y != 0) * scale)


def test_masks_follow_the_global_generator_so_a_resume_draws_the_same_ones():
    dropout = Dropout(0.1).train()
    x = torch.ones(1000)
    torch.manual_seed(7)
    state = torch.get_rng_state()
    first, second = dropout(x), dropout(x)
    assert not torch.equal(first, second)  # each call draws anew
    torch.set_rng_state(state)
    assert torch.equal(dropout(x), first) and torch.equal(dropout(x), second)


@pytest.mark.parametrize("length", [1, 2, 3, 5])
def test_sizes_that_are_not_a_multiple_of_four(length):
    x = torch.ones(2, length)
    torch.manual_seed(0)
    y = Dropout(0.5).train()(x)
    assert y.shape == x.shape and set(y.unique().tolist()) <= {0.0, 2.0}


def test_eval_mode_and_p_zero_leave_the_input_alone():
    x = torch.randn(4, 5)
    assert Dropout(0.3).eval()(x) is x
    assert Dropout(0.0).train()(x) is x


def test_the_drop_probability_is_rounded_to_a_multiple_of_two_to_the_minus_16():
    """What the docstring promises: the rate drawn is round(p * 2^16) / 2^16."""
    assert Dropout(0.1).threshold == 6554 - 2**15
    assert Dropout(0.5).threshold == 0
