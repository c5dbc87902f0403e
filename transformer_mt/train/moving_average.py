"""The exponential moving average of a run's weights (trainer.ema_decay), as Marian keeps it by
default (--exponential-smoothing), fairseq with --ema-decay and OpenNMT-py with
--average_decay: the last model decodes well without a separate averaging of checkpoints.

PyTorch's mechanism does the work: torch.optim.swa_utils.AveragedModel keeps the copy of the
model and calls our update with each parameter group's tensors, which moves them all at once
(torch._foreach_lerp_, one multi-tensor kernel). Ours differs from torch's
get_ema_multi_avg_fn in one thing, the decay's warm-up: d = min(ema_decay, (1 + n) / (10 + n))
at the n-th update (TensorFlow's ExponentialMovingAverage with num_updates), so that in a short
run the average is not held back by the first, random weights (with a constant 0.999 they would
still weigh 22% after 1,500 updates). n is counted here, on the host: AveragedModel hands its
own count to the update as a tensor on the parameters' device, where reading it would wait for
a GPU at every update.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel

from transformer_mt.checkpoint.training_state import MovingAverage
from transformer_mt.errors import CheckpointError
from transformer_mt.train.distributed import Ranks


class WeightAverage:
    """The moving average of `model`'s parameters (its buffers are the model's, copied at
    every update: AveragedModel with use_buffers=False)."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay, self.updates = decay, 0
        self.averaged = AveragedModel(model, multi_avg_fn=self.move, use_buffers=False)

    @property
    def model(self) -> nn.Module:
        """The averaged model, a module of the model's class (validation scores it)."""
        return self.averaged.module

    def current_decay(self) -> float:
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    def move(self, averaged: list[Tensor], current: list[Tensor], _count: Tensor) -> None:
        torch._foreach_lerp_(averaged, current, 1.0 - self.current_decay())

    def update(self, model: nn.Module) -> None:
        """After an update of `model`: the first copies its weights, the next move towards
        them. Every rank of a distributed run holds the same weights, so the same average."""
        with torch.no_grad():
            self.averaged.update_parameters(model)
        self.updates += 1

    def state(self, ranks: Ranks) -> MovingAverage:
        """The average as a checkpoint keeps it, with every rank's digest of its own (a
        collective: every rank calls it); CheckpointError where a rank's differs from rank
        0's."""
        weights = self.model.state_dict()
        digests = ranks.gather(digest(weights))
        differ = [rank for rank, found in enumerate(digests) if not torch.equal(found, digests[0])]
        if differ:  # every rank has the digests: all of them stop here alike
            raise CheckpointError(
                f"the moving average of the weights on rank(s) {differ} differs from rank 0's: "
                "the ranks' models diverged; nothing is saved"
            )
        return MovingAverage(weights, self.updates, digests)

    def load(self, saved: MovingAverage) -> None:
        self.model.load_state_dict(saved.weights)
        self.updates = saved.updates
        self.averaged.n_averaged.fill_(saved.updates)


def digest(weights: dict[str, Tensor]) -> Tensor:
    """(sum, sum of absolute values) of every tensor's values, in float64 on the CPU: two ranks
    that computed the same average have the same digest."""
    values = [t.detach().double() for t in weights.values() if t.is_floating_point()]
    return torch.stack([sum(v.sum() for v in values), sum(v.abs().sum() for v in values)]).cpu()
