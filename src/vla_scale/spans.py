"""Tensors that lie end to end in one storage (the rollout engine's weights, a gathered weight-sync bucket) can be
read and written as one span: one kernel instead of one per tensor, and no concatenation."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from torch import Tensor


def end_to_end(tensors: Sequence[Tensor]) -> bool:
    """Contiguous, of one dtype, in one storage, each starting where the one before ends."""
    if not tensors:
        return False
    first = tensors[0]
    storage = first.untyped_storage().data_ptr()
    return all(t.is_contiguous() and t.dtype == first.dtype and t.untyped_storage().data_ptr() == storage
               for t in tensors) and all(a.data_ptr() + a.nbytes == b.data_ptr() for a, b in pairwise(tensors))


def span(tensors: Sequence[Tensor]) -> Tensor | None:
    """All elements of tensors that lie end to end as one 1-D view, else None."""
    if not end_to_end(tensors):
        return None
    first = tensors[0]
    return first.as_strided((sum(t.numel() for t in tensors),), (1,), first.storage_offset())
