"""PPO's critic math checked by hand: chunk-level GAE for terminated and truncated episodes, the normalisation, the
clipped value loss and the explained variance."""

import pytest
import torch

from vla_scale.algo.ppo import chunk_gae, clipped_value_loss, explained_variance, normalized

F64 = torch.float64


def test_gae_of_a_terminated_episode_by_hand():
    """Three chunks, the last one succeeds (reward 1): nothing follows it, so V_3 = 0 whatever the critic says."""
    rewards, values = torch.tensor([0.0, 0.0, 1.0], dtype=F64), torch.tensor([0.5, 0.6, 0.7], dtype=F64)
    gamma, lam = 0.9, 0.8
    d2 = 1.0 + 0.9 * 0.0 - 0.7  # 0.3
    d1 = 0.0 + 0.9 * 0.7 - 0.6  # 0.03
    d0 = 0.0 + 0.9 * 0.6 - 0.5  # 0.04
    a2 = d2
    a1 = d1 + 0.72 * a2  # 0.246
    a0 = d0 + 0.72 * a1  # 0.21712
    advantages, returns = chunk_gae(rewards, values, last_value=123.0, terminated=True, gamma=gamma, lam=lam)
    assert advantages.tolist() == pytest.approx([a0, a1, a2], abs=1e-12)
    assert returns.tolist() == pytest.approx([a0 + 0.5, a1 + 0.6, a2 + 0.7], abs=1e-12)


def test_gae_of_a_truncated_episode_bootstraps_from_the_final_observation():
    """Two chunks, the step limit cuts the episode: V_2 is the critic's value of the final observation (0.4)."""
    rewards, values = torch.tensor([0.0, 0.0], dtype=F64), torch.tensor([0.2, 0.3], dtype=F64)
    d1 = 0.0 + 0.99 * 0.4 - 0.3  # 0.096
    d0 = 0.0 + 0.99 * 0.3 - 0.2  # 0.097
    advantages, returns = chunk_gae(rewards, values, last_value=0.4, terminated=False, gamma=0.99, lam=0.95)
    assert advantages.tolist() == pytest.approx([d0 + 0.99 * 0.95 * d1, d1], abs=1e-12)
    assert returns.tolist() == pytest.approx([d0 + 0.99 * 0.95 * d1 + 0.2, d1 + 0.3], abs=1e-12)
    terminated, _ = chunk_gae(rewards, values, last_value=0.4, terminated=True, gamma=0.99, lam=0.95)
    assert terminated[1].item() == pytest.approx(-0.3)  # the same episode, had it terminated


def test_lambda_one_gives_discounted_returns_and_lambda_zero_td_errors():
    rewards, values = torch.tensor([0.5, 0.0, 2.0], dtype=F64), torch.tensor([1.0, -1.0, 0.25], dtype=F64)
    _, returns = chunk_gae(rewards, values, 0.0, True, gamma=0.5, lam=1.0)
    assert returns.tolist() == pytest.approx([0.5 + 0.5 * 0.0 + 0.25 * 2.0, 0.0 + 0.5 * 2.0, 2.0])
    td, _ = chunk_gae(rewards, values, 0.0, True, gamma=0.5, lam=0.0)
    assert td.tolist() == pytest.approx([0.5 + 0.5 * -1.0 - 1.0, 0.0 + 0.5 * 0.25 + 1.0, 2.0 - 0.25])


def test_gae_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="rewards"):
        chunk_gae(torch.zeros(3), torch.zeros(2), 0.0, True, 0.9, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        chunk_gae(torch.zeros(2), torch.zeros(2), 0.0, True, 1.5, 0.9)


def test_normalised_advantages_have_mean_zero_and_unit_std():
    x = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    z = normalized(x, float(x.mean()), float(x.std(correction=0)))
    assert float(z.mean()) == pytest.approx(0.0, abs=1e-12)
    assert float(z.std(correction=0)) == pytest.approx(1.0, abs=1e-7)


def test_clipped_value_loss_by_hand():
    """Row 0 moves away from its target past the clip: the plain error is the larger and is taken (the loss pulls it
    back). Row 1 moves inside the clip: the plain error. Row 2 weighs 0 (a final observation) and counts for
    nothing."""
    values = torch.tensor([1.0, 0.55, 9.0], requires_grad=True)
    old = torch.tensor([0.5, 0.5, 0.0])
    returns = torch.tensor([0.0, 1.0, 0.0])
    weights = torch.tensor([0.5, 0.5, 0.0])
    loss, info = clipped_value_loss(values, old, returns, clip=0.2, weights=weights)
    row0 = max((1.0 - 0.0) ** 2, (0.5 + 0.2 - 0.0) ** 2)  # 1.0: unclipped (the clipped one is 0.49)
    row1 = max((0.55 - 1.0) ** 2, (0.55 - 1.0) ** 2)
    assert loss.item() == pytest.approx(0.5 * (0.5 * row0 + 0.5 * row1))
    assert info["value_clip_frac"] == 0.0
    loss.backward()
    assert values.grad is not None and values.grad[2].item() == 0.0

    # target 1.0, old 0.5: moved towards the target by 0.4, past the clip; the clipped value (0.7) errs more and is
    # the one taken, so this row pushes no further
    past = torch.tensor([0.9], requires_grad=True)
    loss, info = clipped_value_loss(past, torch.tensor([0.5]), torch.tensor([1.0]), clip=0.2, weights=torch.ones(1))
    assert loss.item() == pytest.approx(0.5 * (0.7 - 1.0) ** 2)
    assert info["value_clip_frac"] == 1.0
    loss.backward()
    assert past.grad is not None and past.grad.item() == 0.0  # the clipped branch does not depend on the value
    plain, _ = clipped_value_loss(torch.tensor([0.1]), torch.tensor([0.5]), torch.tensor([1.0]), 0.0, torch.ones(1))
    assert plain.item() == pytest.approx(0.5 * 0.81)


def test_explained_variance():
    y = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert explained_variance(y, y) == 1.0
    assert explained_variance(torch.full((4,), 1.5), y) == pytest.approx(0.0)
    assert explained_variance(y, torch.ones(4)) == 0.0  # targets that do not vary
