"""RLOO (REINFORCE leave-one-out; Kool et al. 2019, Ahmadian et al. 2024, as TRL's and verl's RLOO compute it): each
episode's advantage is its reward minus the mean reward of the other episodes of its group, a baseline that does not
depend on the episode itself, with no division by the group's spread and no critic. `algo=rloo`."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from vla_scale.algo.base import EpisodeOutcomes
from vla_scale.objectives.groups import check_rewards, group_index, group_sums


def leave_one_out_advantages(rewards: Tensor, uids: Sequence[Hashable] | Tensor) -> Tensor:
    """A_i = r_i - (sum_{j in g, j != i} r_j) / (n_g - 1), with g the group (``uid``) of episode i and n_g its size:
    equal to n_g / (n_g - 1) * (r_i - mean_g). A group of one has no other episode to compare with: its advantage is
    0. Computed in float64; returns [N] float32 (or the rewards' floating dtype)."""
    check_rewards(rewards)
    index, n_groups = group_index(uids, rewards.shape[0], rewards.device)
    r = rewards.detach().to(torch.float64)
    counts = group_sums(torch.ones_like(r), index, n_groups)[index]
    others = group_sums(r, index, n_groups)[index] - r
    advantages = torch.where(counts > 1, r - others / (counts - 1).clamp(min=1), torch.zeros_like(r))
    return advantages.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


class RLOO(EpisodeOutcomes):
    name = "rloo"
    group_reason = "RLOO's baseline is the mean of the other episodes of the group"
    episode_advantages = staticmethod(leave_one_out_advantages)


ALGORITHM = RLOO
