import math

import torch

from transformer_mt.train.loss import label_smoothed_loss


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
