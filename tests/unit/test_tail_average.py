"""Averaging the weights of a training run's last steps (train/average.py)."""

import pytest

torch = pytest.importorskip("torch")

from llmframe_ray.train.average import TailAverage  # noqa: E402
from llmframe_ray.train.reranker import TrainConfig  # noqa: E402


def run(share: float, total: int = 8) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Set two parameters to known values after each step, as an optimiser would move them."""
    a = torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(2, 2))
    average = TailAverage([a, b], total, share)
    for step in range(1, total + 1):
        with torch.no_grad():
            a.copy_(torch.tensor([step, 2.0 * step, -step], dtype=torch.float32))
            b.fill_(step * step)
        average.update(step)
    return a.detach(), b.detach(), average.apply()


def test_mean_of_the_last_share_of_the_steps():
    a, b, count = run(0.5)
    # steps 5..8 of 8: a = (6.5, 13, -6.5); b = mean of 25, 36, 49, 64
    assert count == 4
    assert a.tolist() == [6.5, 13.0, -6.5]
    assert b.tolist() == [[43.5, 43.5], [43.5, 43.5]]
    assert a.dtype == torch.float32


def test_share_zero_keeps_the_last_weights():
    a, b, count = run(0.0)
    assert count == 0
    assert a.tolist() == [8.0, 16.0, -8.0] and b.tolist() == [[64.0, 64.0], [64.0, 64.0]]


def test_a_share_too_small_for_one_step_averages_nothing():
    a, _, count = run(0.1, total=5)  # int(0.5) = 0 steps
    assert count == 0 and a.tolist() == [5.0, 10.0, -5.0]


def test_sums_do_not_alias_the_weights():
    """A float64 weight converted to float64 is the same tensor unless copied: the sum must be a copy."""
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    average = TailAverage([p], 2, 0.99)  # int(1.98) = 1 step: step 2 only
    with torch.no_grad():
        p.fill_(3.0)
    average.update(2)
    with torch.no_grad():
        p.fill_(100.0)
    assert average.apply() == 1 and p.tolist() == [3.0, 3.0]


def test_a_share_that_floats_below_its_step_count_keeps_it():
    """100 x 0.57 is 56.99999999999999 in floating point: still the last 57 steps."""
    assert TailAverage([], 100, 0.57).first == 44
    assert TailAverage([], 100, 0.29).first == 72


def test_config_refuses_a_share_outside_0_1():
    with pytest.raises(ValueError, match=r"average_last must be in \[0, 1\), got 1.0"):
        TrainConfig(average_last=1.0)
    with pytest.raises(ValueError, match=r"average_last must be in \[0, 1\), got -0.1"):
        TrainConfig(average_last=-0.1)
