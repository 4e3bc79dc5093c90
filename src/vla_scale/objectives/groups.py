"""Episodes in groups (one ``uid`` per task spec, n episodes each, 0/1 success rewards): the group statistics the
group-relative algorithms build their advantages on, and the dynamic-sampling filter that drops groups without signal.

Every function is pure (no state, no I/O) and imports only torch.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

# Slack for group-mean comparisons: sums of non-binary rewards can land one rounding step off a bound.
_BOUND_TOL = 1e-9


def group_index(uids: Sequence[Hashable] | Tensor, n: int, device: torch.device) -> tuple[Tensor, int]:
    """Map each episode's uid to a dense group index in [0, G); members of a group need not be adjacent."""
    if len(uids) != n:
        raise ValueError(f"got {len(uids)} uids for {n} rewards")
    if isinstance(uids, Tensor):
        if uids.dim() != 1:
            raise ValueError(f"uids must be 1-D, got shape {tuple(uids.shape)}")
        _, index = torch.unique(uids, return_inverse=True)
        index = index.to(device)
    else:
        first_seen: dict[Hashable, int] = {}
        index = torch.tensor([first_seen.setdefault(u, len(first_seen)) for u in uids], dtype=torch.long, device=device)
    n_groups = int(index.max()) + 1 if n > 0 else 0
    return index, n_groups


def check_rewards(rewards: Tensor) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")


def group_sums(values: Tensor, index: Tensor, n_groups: int) -> Tensor:
    """Per-group sum of a float64 vector."""
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, index, values)


def group_means(rewards: Tensor, index: Tensor, n_groups: int) -> tuple[Tensor, Tensor]:
    """Per-group (count, mean) in float64: a mean of k/n binary rewards is then exactly the correctly rounded k/n."""
    r = rewards.detach().to(torch.float64)
    counts = group_sums(torch.ones_like(r), index, n_groups)
    return counts, group_sums(r, index, n_groups) / counts


def _group_keep(means: Tensor, low: float, high: float) -> Tensor:
    """Per-group flag: low <= mean <= high (inclusive, up to _BOUND_TOL)."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"need 0 <= low <= high <= 1, got low={low}, high={high}")
    return (means >= low - _BOUND_TOL) & (means <= high + _BOUND_TOL)


def group_success_filter(
    rewards: Tensor, uids: Sequence[Hashable] | Tensor, low: float = 0.1, high: float = 0.9
) -> Tensor:
    """Dynamic sampling: keep[i] = low <= mean_{g(i)}(r) <= high, both bounds inclusive; returns bool [N].

    A group whose episodes all fail (mean 0) or all succeed (mean 1) has all-zero GRPO advantages, so it only dilutes
    the token-mean loss; groups near those extremes are dropped as well with the default [0.1, 0.9]. The mean of k/n
    binary rewards is computed in float64, so e.g. 1 success out of 10 equals the bound 0.1 and is kept.
    """
    check_rewards(rewards)
    index, n_groups = group_index(uids, rewards.shape[0], rewards.device)
    _, means = group_means(rewards, index, n_groups)
    return _group_keep(means, low, high)[index]
