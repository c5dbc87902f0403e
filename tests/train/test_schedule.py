import math

import pytest
import torch

from transformer_mt.train.schedule import inverse_sqrt_lr, paper_schedule


@pytest.mark.parametrize("step", [1, 4000, 100000])
def test_paper_formula(step):
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert math.isclose(
        inverse_sqrt_lr(step, d_model=512, warmup_steps=4000), expected, rel_tol=1e-12
    )


def test_known_values():
    assert math.isclose(
        inverse_sqrt_lr(4000, d_model=512, warmup_steps=4000), 512**-0.5 * 4000**-0.5
    )
    assert math.isclose(inverse_sqrt_lr(1, d_model=512, warmup_steps=4000), 512**-0.5 * 4000**-1.5)
    assert math.isclose(
        inverse_sqrt_lr(100000, d_model=512, warmup_steps=4000), 512**-0.5 * 100000**-0.5
    )


def test_scheduler_gives_update_k_the_lr_of_step_k():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter])
    scheduler = paper_schedule(optimizer, d_model=512, warmup_steps=4000, scale=1.0)
    seen = []
    for _ in range(3):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx(
        [inverse_sqrt_lr(k, d_model=512, warmup_steps=4000) for k in (1, 2, 3)]
    )
