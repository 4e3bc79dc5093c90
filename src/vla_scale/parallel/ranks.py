"""What every rank computes together: a number's mean over the process group's ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist


def mean_over_ranks(value: float, world: int, device: torch.device) -> float:
    """`value`'s mean over the ranks (every rank must call it equally often: it is a collective). `device`: where
    this rank's tensors live (NCCL reduces device tensors only)."""
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / world
