"""GRPO math against hand-computed values (CPU, milliseconds)."""

from __future__ import annotations

import math

import pytest
import torch

from vla_scale.algo.grpo import group_advantages
from vla_scale.objectives import (
    clipped_policy_loss,
    executed_action_mask,
    group_success_filter,
    logprob_mismatch,
    logprobs_from_logits,
    token_entropy,
    token_weights,
    truncated_is_weights,
)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """torch.allclose with the values in the message (torch.testing's version costs ~0.5 s of lazy imports)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected.to(actual.dtype), atol=atol, rtol=rtol), (actual, expected)


# ---------------------------------------------------------------- advantages


def test_advantages_hand_computed_with_interleaved_groups():
    # a: r = 1, 1, 0 at positions 0, 2, 4 -> mean 2/3, unbiased std sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = sqrt(1/3)
    # b: 0, 0 (all equal) -> 0;  c: single member -> 0;  d: 1, 0 -> mean 1/2, unbiased std sqrt(1/2)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    uids = ["a", "b", "a", "b", "a", "c", "d", "d"]
    s3 = math.sqrt(1 / 3)
    s2 = math.sqrt(1 / 2)
    expected = torch.tensor([(1 / 3) / s3, 0.0, (1 / 3) / s3, 0.0, (-2 / 3) / s3, 0.0, 0.5 / s2, -0.5 / s2])
    adv = group_advantages(rewards, uids, eps=0.0)
    assert_close(adv, expected)
    assert adv.dtype == torch.float32


def test_advantages_eps_in_denominator():
    adv = group_advantages(torch.tensor([1.0, 0.0]), ["g", "g"], eps=0.1)
    s = math.sqrt(0.5)
    assert_close(adv, torch.tensor([0.5 / (s + 0.1), -0.5 / (s + 0.1)]))


def test_advantages_tensor_uids_match_string_uids():
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    by_str = group_advantages(rewards, ["x", "y", "x", "y", "x", "y"])
    tensor_uids = torch.tensor([7, -3, 7, -3, 7, -3])
    by_tensor = group_advantages(rewards, tensor_uids)
    assert_close(by_tensor, by_str)
    assert by_str.abs().sum() > 0


def test_advantages_equal_nonbinary_rewards_are_exactly_zero():
    # 0.1 summed three times in float is not 3 * 0.1: the group must still give exact zeros, not residue / eps.
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7], dtype=torch.float32)
    adv = group_advantages(rewards, ["g", "g", "g", "h"])
    assert torch.equal(adv, torch.zeros(4))


def test_advantages_zero_mean_per_group_and_integer_rewards():
    rewards = torch.tensor([1, 0, 0, 1, 1, 0, 1, 1])
    uids = ["a", "b"] * 4
    adv = group_advantages(rewards, uids)
    assert adv.dtype == torch.float32
    assert abs(float(adv[0::2].sum())) < 1e-5 and abs(float(adv[1::2].sum())) < 1e-5
    # group a = 1, 0, 1, 1: mean 3/4, unbiased std = sqrt(0.25) = 0.5 -> success 0.5, failure -1.5
    assert_close(adv[0::2], torch.tensor([0.5, -1.5, 0.5, 0.5]), atol=1e-5, rtol=0)


def test_advantages_reject_length_mismatch():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(3), ["a", "b"])


# ---------------------------------------------------------------- group filter


def _groups(successes_per_group: list[tuple[int, int]]) -> tuple[torch.Tensor, list[str]]:
    """Rewards and uids for groups given as (k successes, n episodes), interleaved round-robin."""
    members = [[1.0] * k + [0.0] * (n - k) for k, n in successes_per_group]
    rewards, uids = [], []
    for j in range(max(len(m) for m in members)):
        for g, m in enumerate(members):
            if j < len(m):
                rewards.append(m[j])
                uids.append(f"g{g}")
    return torch.tensor(rewards), uids


def test_filter_bounds_inclusive_extremes_dropped():
    spec = [(0, 10), (1, 10), (5, 10), (9, 10), (10, 10), (2, 20), (1, 11), (10, 11)]
    rewards, uids = _groups(spec)
    keep = group_success_filter(rewards, uids, low=0.1, high=0.9)
    kept_groups = {u for u, k in zip(uids, keep.tolist(), strict=True) if k}
    assert kept_groups == {"g1", "g2", "g3", "g5"}  # 0.1, 0.5, 0.9, 0.1 kept; 0, 1, 1/11, 10/11 dropped
    for u, k in zip(uids, keep.tolist(), strict=True):  # whole groups, never parts of one
        assert k == (u in kept_groups)
    assert keep.dtype == torch.bool


def test_filter_custom_bounds():
    rewards, uids = _groups([(1, 4), (2, 4), (3, 4)])
    keep = group_success_filter(rewards, uids, low=0.5, high=0.5)
    assert {u for u, k in zip(uids, keep.tolist(), strict=True) if k} == {"g1"}


def _leaf(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def test_loss_ratio_one_is_minus_token_mean_advantage():
    old = torch.tensor([[-1.0, -2.0], [-0.5, -3.0], [-1.5, -0.2]])
    new = old.clone().requires_grad_(True)
    adv = torch.tensor([1.0, 4.0, 3.0])
    mask = torch.tensor([[True, True], [True, False], [False, False]])
    loss, m = clipped_policy_loss(new, old, adv, mask)
    # valid tokens carry A = 1, 1, 4 -> token mean 2 (a per-row mean would give 2.5)
    assert loss.item() == pytest.approx(-2.0)
    assert m["clip_frac"] == 0.0 and m["ratio_mean"] == pytest.approx(1.0) and m["approx_kl"] == pytest.approx(0.0)
    assert m["n_tokens"] == 3.0
    loss.backward()
    assert_close(new.grad, torch.tensor([[-1 / 3, -1 / 3], [-4 / 3, 0.0], [0.0, 0.0]]))


def test_loss_positive_advantage_clips_at_one_plus_clip_high():
    # token 0: ratio 1.5 -> clipped to 1.28;  token 1: ratio 1.25 stays (would clip under a symmetric 0.2)
    new = _leaf([[math.log(1.5), math.log(1.25)]])
    old = torch.zeros(1, 2)
    loss, m = clipped_policy_loss(new, old, torch.tensor([2.0]), torch.ones(1, 2, dtype=torch.bool))
    assert loss.item() == pytest.approx(-(1.28 * 2 + 1.25 * 2) / 2)
    assert m["clip_frac"] == pytest.approx(0.5)
    assert m["ratio_mean"] == pytest.approx((1.5 + 1.25) / 2)
    assert m["approx_kl"] == pytest.approx(((0.5 - math.log(1.5)) + (0.25 - math.log(1.25))) / 2)
    loss.backward()
    assert_close(new.grad, torch.tensor([[0.0, -2.0 * 1.25 / 2]]))


def test_loss_negative_advantage_clips_at_one_minus_clip_low():
    # ratio 0.5 -> 0.8; ratio 0.75 -> 0.8 too (would stay under a symmetric 0.28); ratio 0.9 stays
    new = _leaf([[math.log(0.5), math.log(0.75), math.log(0.9)]])
    loss, m = clipped_policy_loss(new, torch.zeros(1, 3), torch.tensor([-1.0]), torch.ones(1, 3, dtype=torch.bool))
    assert loss.item() == pytest.approx((0.8 + 0.8 + 0.9) / 3)
    assert m["clip_frac"] == pytest.approx(2 / 3)
    loss.backward()
    assert_close(new.grad, torch.tensor([[0.0, 0.0, 0.9 / 3]]))


def test_loss_unclipped_side_keeps_gradient():
    # A > 0 with ratio 0.5 and A < 0 with ratio 1.5: min() picks the unclipped term, the gradient flows
    new = _leaf([[math.log(0.5)], [math.log(1.5)]])
    loss, m = clipped_policy_loss(new, torch.zeros(2, 1), torch.tensor([1.0, -1.0]), torch.ones(2, 1))
    assert loss.item() == pytest.approx(-(0.5 - 1.5) / 2)
    assert m["clip_frac"] == 0.0
    loss.backward()
    assert_close(new.grad, torch.tensor([[-0.5 / 2], [1.5 / 2]]))


def test_masked_tokens_do_not_affect_loss_or_gradients():
    valid_new = [[math.log(1.1), math.log(0.7)], [math.log(1.4), 0.0]]
    adv = torch.tensor([1.5, -0.5])
    mask = torch.tensor([[True, True], [True, False]])
    clean = _leaf(valid_new)
    loss_clean, m_clean = clipped_policy_loss(clean, torch.zeros(2, 2), adv, mask)
    loss_clean.backward()

    dirty = _leaf([[valid_new[0][0], valid_new[0][1]], [valid_new[1][0], 80.0]])  # exp(80) overflows float32
    old = torch.tensor([[0.0, 0.0], [0.0, float("nan")]])
    loss_dirty, m_dirty = clipped_policy_loss(dirty, old, adv, mask)
    loss_dirty.backward()

    assert torch.isfinite(loss_dirty)
    assert loss_dirty.item() == pytest.approx(loss_clean.item())
    assert m_dirty == pytest.approx(m_clean)
    assert_close(dirty.grad, clean.grad)
    assert float(dirty.grad[1, 1]) == 0.0


def test_row_mask_equals_expanded_token_mask():
    new = _leaf([[-0.1, -0.3], [-0.2, -0.9], [-0.4, -0.4]])
    old = torch.tensor([[-0.2, -0.2], [-0.2, -0.2], [-0.2, -0.2]])
    adv = torch.tensor([1.0, -2.0, 0.5])
    rows = torch.tensor([True, False, True])
    loss_rows, _ = clipped_policy_loss(new, old, adv, rows)
    loss_tokens, _ = clipped_policy_loss(new, old, adv, rows.unsqueeze(1).expand(3, 2))
    assert loss_rows.item() == pytest.approx(loss_tokens.item())
    (grad,) = torch.autograd.grad(loss_rows, new)
    assert torch.equal(grad[1], torch.zeros(2)) and grad[0].abs().sum() > 0


def test_all_masked_batch_gives_finite_zero_loss_with_grad():
    new = _leaf([[-1.0, -2.0], [-0.5, float("-inf")]])
    loss, m = clipped_policy_loss(new, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.zeros(2, 2))
    assert torch.isfinite(loss) and loss.item() == 0.0
    assert loss.grad_fn is not None
    loss.backward()
    assert torch.equal(new.grad, torch.zeros(2, 2))
    assert all(math.isfinite(v) for v in m.values()) and m["n_tokens"] == 0.0


def test_loss_rejects_bad_shapes():
    with pytest.raises(ValueError):
        clipped_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError):
        clipped_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(3))


# ---------------------------------------------------------------- log-probs and entropy


def test_logprobs_match_categorical_at_temperature():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 4
    tokens = torch.randint(0, 11, (3, 5), generator=g)
    expected = torch.distributions.Categorical(logits=logits / 1.6).log_prob(tokens)
    got = logprobs_from_logits(logits, tokens, temperature=1.6)
    assert_close(got, expected)
    assert not torch.allclose(got, logprobs_from_logits(logits, tokens, temperature=1.0))


def test_logprobs_stable_for_huge_logits():
    logits = torch.tensor([[1e4, 1e4 - 1.0, -1e4]])
    got = logprobs_from_logits(logits, torch.tensor([0]), temperature=1.0)
    assert_close(got, torch.tensor([-math.log1p(math.exp(-1.0))]))


def test_entropy_uniform_is_log_vocab():
    assert torch.allclose(token_entropy(torch.zeros(2, 3, 256)), torch.full((2, 3), math.log(256)))


def test_entropy_matches_categorical_and_handles_neg_inf():
    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(1)) * 3
    expected = torch.distributions.Categorical(logits=logits / 2.0).entropy()
    assert_close(token_entropy(logits, temperature=2.0), expected)

    masked = torch.tensor([[0.0, 0.0, float("-inf")], [5.0, float("-inf"), float("-inf")]], requires_grad=True)
    h = token_entropy(masked)
    assert_close(h, torch.tensor([math.log(2), 0.0]), atol=1e-6, rtol=0)
    h.sum().backward()
    assert torch.isfinite(masked.grad).all()


# ---------------------------------------------------------------- per-action mask and loss aggregation


def test_executed_action_mask_keeps_the_tokens_of_the_actions_that_ran():
    """Chunk of 3 actions x 2 dims; token 2i + j is action i. An episode that stopped after 1 action keeps 2 tokens."""
    mask = executed_action_mask(torch.tensor([3, 1, 0, 2]), chunk_len=3, action_dim=2)
    assert mask.tolist() == [[True] * 6, [True, True, False, False, False, False], [False] * 6,
                             [True, True, True, True, False, False]]
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        executed_action_mask(torch.tensor([4]), chunk_len=3, action_dim=2)


def _ragged_batch():
    """Episode 0: 2 chunk steps of 4 valid tokens + 1 of 1; episode 1: one step of 2 valid tokens (L = 4)."""
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    return mask, torch.tensor([0, 0, 0, 1])


def test_token_weights_by_hand_for_ragged_episodes():
    mask, episode = _ragged_batch()
    token = token_weights(mask, episode, "token_mean")
    assert_close(token, mask.double() / 11)  # 11 valid tokens, each 1/11
    traj = token_weights(mask, episode, "trajectory_mean")
    # episode 0 has 9 valid tokens, episode 1 has 2; two episodes: 1/(2*9) and 1/(2*2)
    expected = torch.tensor([[1 / 18] * 4, [1 / 18] * 4, [1 / 18, 0, 0, 0], [1 / 4, 1 / 4, 0, 0]], dtype=torch.float64)
    assert_close(traj, expected, atol=1e-12, rtol=0)
    for weights in (token, traj):
        assert abs(float(weights.sum()) - 1.0) < 1e-12
    with pytest.raises(ValueError, match="loss aggregation"):
        token_weights(mask, episode, "seq_mean")


def test_weighted_loss_over_micro_batches_is_the_hand_computed_aggregate():
    """ratio 1 everywhere (new = old), so each valid token's objective is its row's advantage; summing the weighted
    losses of any split into micro-batches gives -(sum over episodes of A_e / E) for trajectory_mean and
    -(sum over tokens of A / N) for token_mean."""
    mask, episode = _ragged_batch()
    adv = torch.tensor([1.0, 1.0, 1.0, -2.0])  # episode 0: +1, episode 1: -2
    logp = torch.full((4, 4), -1.0)
    expected = {"token_mean": -(9 * 1.0 + 2 * -2.0) / 11, "trajectory_mean": -(1.0 + -2.0) / 2}
    for aggregation, value in expected.items():
        weights = token_weights(mask, episode, aggregation).float()
        for split in ([[0, 1, 2, 3]], [[0, 1], [2, 3]], [[3], [0, 2], [1]]):
            total = sum(clipped_policy_loss(logp[s], logp[s], adv[s], mask[s], weights=weights[s])[0].item()
                        for s in split)
            assert abs(total - value) < 1e-6, (aggregation, split, total, value)
    # without weights: the token mean over whatever one call gets
    loss, _ = clipped_policy_loss(logp, logp, adv, mask)
    assert abs(loss.item() - expected["token_mean"]) < 1e-6


# ---------------------------------------------------------------- old log-probs: mismatch and truncated IS


def test_truncated_importance_weights_by_hand():
    actor = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.9)]])
    rollout = torch.tensor([[math.log(0.25), math.log(0.4), math.log(0.1)]])
    # ratios 2, 0.5, 9 -> capped at 3
    assert_close(truncated_is_weights(actor, rollout, 3.0), torch.tensor([[2.0, 0.5, 3.0]]))
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(actor, rollout, 0.0)


def test_logprob_mismatch_by_hand():
    actor = torch.tensor([[0.0, math.log(2.0), 5.0]])
    rollout = torch.tensor([[0.0, 0.0, -5.0]])
    mask = torch.tensor([[True, True, False]])  # the third token (a huge difference) never ran
    stats = logprob_mismatch(actor, rollout, mask, clip_low=0.2, clip_high=0.28)
    assert abs(stats["abs_log_ratio"] - math.log(2.0) / 2) < 1e-6
    assert abs(stats["approx_kl"] - (2.0 - 1.0 - math.log(2.0)) / 2) < 1e-6  # k3 of ratio 1 is 0, of 2 is 1 - ln 2
    assert stats["outside_clip"] == 0.5  # ratio 2 > 1.28
    assert abs(stats["weight_std"] - 0.5) < 1e-6 and abs(stats["weight_max"] - 2.0) < 1e-6  # ratios 1 and 2
    assert stats["truncated"] == 0.0  # no cap
    assert logprob_mismatch(actor, rollout, mask, tis_cap=1.5)["truncated"] == 0.5  # 2 > 1.5, 1 is not
    assert logprob_mismatch(actor, rollout, torch.zeros(1, 3, dtype=torch.bool))["abs_log_ratio"] == 0.0
