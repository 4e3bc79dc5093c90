"""GRPO (group relative policy optimisation, as SimpleVLA-RL runs it for VLAs): each episode's advantage is its
success against its group's, in the group's standard deviations; no critic. `algo=grpo` (an SFT policy) and
`algo=grpo_scratch` (a fresh one)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from vla_scale.algo.base import EpisodeOutcomes
from vla_scale.objectives.groups import check_rewards, group_index, group_means, group_sums


def group_advantages(rewards: Tensor, uids: Sequence[Hashable] | Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO advantage A_i = (r_i - mean_g) / (std_g + eps), with g the group (``uid``) of episode i.

    std_g is the unbiased (Bessel-corrected, n-1) sample std, as in ``torch.std`` and in the GRPO implementations of
    verl / SimpleVLA-RL, so learning rates and clip ranges tuned there carry over unchanged. Relative to the
    population std, every advantage is smaller by the factor sqrt((n-1)/n) (0.935 for groups of n = 8).

    A group carries no relative signal when all its rewards are equal (including a single-member group, whose
    unbiased std is undefined): its advantages are exactly 0, not a rounding residue divided by eps.
    Episodes of one group may sit anywhere in the batch. Returns [N] in the dtype of ``rewards`` (float32 if integer).
    """
    check_rewards(rewards)
    n = rewards.shape[0]
    index, n_groups = group_index(uids, n, rewards.device)
    counts, means = group_means(rewards, index, n_groups)
    r = rewards.detach().to(torch.float64)
    deviation = r - means[index]
    sum_sq = group_sums(deviation.square(), index, n_groups)
    std = (sum_sq / (counts - 1).clamp(min=1)).sqrt()
    advantages = deviation / (std[index] + eps)
    group_max = torch.full((n_groups,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce_(0, index, r, "amax")
    group_min = torch.full((n_groups,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce_(0, index, r, "amin")
    no_signal = (counts < 2) | (group_max == group_min)
    advantages = torch.where(no_signal[index], torch.zeros_like(advantages), advantages)
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    return advantages.to(out_dtype)

class GRPO(EpisodeOutcomes):
    name = "grpo"
    group_reason = "GRPO normalises each episode against its group"
    episode_advantages = staticmethod(group_advantages)


ALGORITHM = GRPO
