"""Tensors that lie end to end in one storage (the rollout engine's weights, a gathered weight-sync bucket) can be
read and written as one span: one kernel instead of one per tensor, and no concatenation."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from torch import Tensor


def end_to_end(tensors: Sequence[Tensor]) -> bool:
    """Contiguous, of one dtype, in one storage, each starting where the one before ends.

    Addresses alone are compared per tensor (asking for a tensor's storage costs microseconds, and a weight sync
    asks this of thousands): two allocations can sit side by side, so the first tensor's storage must also reach to
    the end of the last one."""
    if not tensors:
        return False
    first, last = tensors[0], tensors[-1]
    if not all(t.is_contiguous() and t.dtype == first.dtype for t in tensors):
        return False
    if not all(follows(a, b) for a, b in pairwise(tensors)):
        return False
    return reaches(first, last)


def follows(before: Tensor, after: Tensor) -> bool:
    """Does `after` start at the address where `before` ends? (Addresses only: see `reaches` for the storage.)"""
    return before.data_ptr() + before.nbytes == after.data_ptr()


def reaches(first: Tensor, last: Tensor) -> bool:
    """Does `first`'s storage hold everything from `first` to the end of `last`?"""
    storage = first.untyped_storage()
    end = storage.data_ptr() + storage.nbytes()
    return first.data_ptr() <= last.data_ptr() and last.data_ptr() + last.nbytes <= end


def span(tensors: Sequence[Tensor]) -> Tensor | None:
    """All elements of tensors that lie end to end as one 1-D view, else None."""
    if not end_to_end(tensors):
        return None
    first = tensors[0]
    return first.as_strided((sum(t.numel() for t in tensors),), (1,), first.storage_offset())
