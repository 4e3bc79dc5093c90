"""What every rank computes together: a number's mean, or numbers' sums, over the process group's ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist


def mean_over_ranks(value: float, world: int, device: torch.device) -> float:
    """`value`'s mean over the ranks (every rank must call it equally often: it is a collective). `device`: where
    this rank's tensors live (NCCL reduces device tensors only)."""
    return sum_over_ranks([value], world, device)[0] / world


def sum_over_ranks(values: list[float], world: int, device: torch.device) -> list[float]:
    """Each of `values` summed over the ranks, in one collective (every rank passes as many)."""
    if world == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()
