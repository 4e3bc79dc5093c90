"""Flow-SDE's transition by hand, against πRL's form of it and against torch's Normal; a = 0 is the Euler step; and
the SDE keeps the flow's marginals (a 1-D Gaussian whose exact velocity is known ends where the ODE does)."""

from __future__ import annotations

import math

import pytest
import torch

from vla_scale.objectives.flow_sde import (
    action_mask,
    chain_logprob,
    euler_times,
    gaussian_logprob,
    sde_sigma,
    sde_transition,
)


def test_euler_times_accumulate_in_float32_from_one():
    times, dt = euler_times(10)
    assert times.dtype == dt.dtype == torch.float32 and times.shape == (10,)
    expected, t = [], torch.tensor(1.0)
    for _ in range(10):
        expected.append(t)
        t = t + torch.tensor(-0.1)
    assert torch.equal(times, torch.stack(expected)) and dt.item() == pytest.approx(-0.1)
    with pytest.raises(ValueError):
        euler_times(0)


def test_mean_and_std_by_hand():
    """x = 1, v = 2, t = 0.5, dt = -0.25, a = 0.5: sigma = 0.5 sqrt(0.5 / 0.5) = 0.5; the noise estimate
    x + (1 - t) v = 2; Euler 1 - 0.5 = 0.5; correction 0.25 * -0.25 / 1 * 2 = -0.125; std 0.5 * sqrt(0.25)."""
    x, v = torch.tensor([[[1.0]]]), torch.tensor([[[2.0]]])
    mean, std = sde_transition(x, v, torch.tensor([0.5]), -0.25, 0.5)
    assert mean.item() == pytest.approx(0.375) and std.item() == pytest.approx(0.25)


def test_the_first_step_floors_one_minus_t_at_the_step_so_its_std_is_the_noise_level():
    assert sde_sigma(torch.tensor(1.0), -0.25, 0.5).item() == pytest.approx(0.5 * math.sqrt(1 / 0.25))
    _, std = sde_transition(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.tensor([1.0]), -0.25, 0.7)
    assert std.item() == pytest.approx(0.7)


def test_the_mean_is_pi_rls_mix_of_the_two_predictions():
    """πRL writes the mean as x0_hat * (1 - t') + x1_hat * (t' - sigma^2 |dt| / (2 t)), t' = t + dt, with the
    predicted data x0_hat = x - t v and noise x1_hat = x + (1 - t) v; ours is the Euler step plus a correction."""
    g = torch.Generator().manual_seed(0)
    x, v = (torch.randn(5, 4, 3, generator=g, dtype=torch.float64) for _ in range(2))
    t = torch.tensor([1.0, 0.8, 0.5, 0.3, 0.1], dtype=torch.float64)
    dt, a = -0.1, 0.6
    mean, std = sde_transition(x, v, t, dt, a)
    sigma = sde_sigma(t, dt, a)[:, None, None]
    tt = t[:, None, None]
    x0_hat, x1_hat = x - tt * v, x + (1 - tt) * v
    theirs = x0_hat * (1 - (tt + dt)) + x1_hat * ((tt + dt) - sigma**2 * -dt / (2 * tt))
    assert torch.allclose(mean, theirs, atol=1e-12)
    assert torch.allclose(std, sigma * math.sqrt(0.1), atol=1e-12)


def test_noise_level_zero_is_the_euler_step_bit_for_bit_and_scores_zero():
    g = torch.Generator().manual_seed(1)
    x, v = torch.randn(3, 4, 8, generator=g), torch.randn(3, 4, 8, generator=g)
    times, dt = euler_times(10)
    for k in range(10):
        mean, std = sde_transition(x, v, times[k], dt, 0.0)
        assert torch.equal(mean, x + dt * v) and torch.all(std == 0)
        assert torch.equal(gaussian_logprob(mean, mean, std), torch.zeros(3))


def test_logprob_is_normals_summed_over_the_masked_elements():
    g = torch.Generator().manual_seed(2)
    x, mean = torch.randn(2, 4, 6, generator=g), torch.randn(2, 4, 6, generator=g)
    std = torch.rand(2, 1, 1, generator=g) + 0.1
    mask = action_mask(4, 6, 5, executed=torch.tensor([4, 2]))
    ours = gaussian_logprob(x, mean, std, mask)
    normal = torch.distributions.Normal(mean, std.expand_as(x)).log_prob(x)
    assert torch.allclose(ours, (normal * mask).sum(dim=(1, 2)), atol=1e-5)
    assert torch.allclose(gaussian_logprob(x, mean, std), normal.sum(dim=(1, 2)), atol=1e-5)
    steps = torch.stack([ours, 2 * ours], dim=1)
    assert torch.allclose(chain_logprob(steps), 3 * ours)


def test_action_mask_covers_the_robots_dims_and_the_executed_steps():
    mask = action_mask(3, 4, 2)
    assert mask.shape == (3, 4) and mask.sum() == 6 and mask[:, :2].all()
    per_example = action_mask(3, 4, 2, executed=torch.tensor([3, 1]))
    assert per_example.shape == (2, 3, 4) and per_example.sum(dim=(1, 2)).tolist() == [6, 2]
    with pytest.raises(ValueError):
        action_mask(3, 4, 5)


def gaussian_velocity(x: torch.Tensor, t: torch.Tensor, m: float, s: float) -> torch.Tensor:
    """The exact velocity E[noise - data | x_t] when the data is N(m, s^2) and x_t = t noise + (1 - t) data."""
    var = t**2 + (1 - t) ** 2 * s**2
    centred = x - (1 - t) * m
    return t / var * centred - (m + (1 - t) * s**2 / var * centred)


@pytest.mark.parametrize("noise_level", [0.0, 0.5, 1.0])
def test_the_sde_keeps_the_flows_marginals(noise_level):
    """With the exact velocity, the SDE chain ends at the data distribution as the ODE's does (up to the Euler
    error); a wrong sign or factor in the correction would not."""
    m, s, steps = 1.5, 0.4, 100
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40_000, 1, 1, generator=g, dtype=torch.float64)
    times, dt = euler_times(steps)
    for k in range(steps):
        t = times[k].double()
        mean, std = sde_transition(x, gaussian_velocity(x, t, m, s), t, dt.double(), noise_level)
        x = mean + std * torch.randn(x.shape, generator=g, dtype=torch.float64)
    assert x.mean().item() == pytest.approx(m, abs=0.02)
    assert x.std().item() == pytest.approx(s, abs=0.02)
