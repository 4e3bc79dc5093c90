"""Fingerprints of exact weights, computed where the weights live (GPU or CPU).

A weight sync moves billions of parameters; proving that the receiver holds exactly the sender's bytes must not
copy them to the host. `tensor_fingerprint` reduces a tensor's bytes on its own device to two wrapping sums of its
32-bit words (bytes, for tensors whose size is not a multiple of 4), each word first multiplied by an odd weight
that depends on its position, in wrapping 32-bit arithmetic. A change to any single word changes its product (an odd
number is invertible mod 2^32), hence both sums; several changes cancel only by coincidence. It detects bit flips,
stale or missing buckets, dtype and order mix-ups; it is not a defence against deliberate collisions.

`weights_checksum` hashes names, shapes, dtypes and fingerprints in name order: equal iff (up to that coincidence)
the weights are identical.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
from torch import Tensor

_CHUNK = 1 << 24  # words per reduction: bounds each temporary product to 64 MB
_WEIGHTS: dict[tuple[str, int, torch.dtype], Tensor] = {}  # (device, lane, word type) -> odd per-position weights


def _odd_weights(device: torch.device, lane: int, dtype: torch.dtype, n: int) -> Tensor:
    """The first `n` weights of a lane (built once per device and word type, grown as needed)."""
    key = (str(device), lane, dtype)
    if key not in _WEIGHTS or _WEIGHTS[key].numel() < n:
        pos = torch.arange(min(_CHUNK, max(n, 1 << 16)), dtype=torch.int64, device=device)
        odd = ((pos * (0x9E3779B1, 0x85EBCA77)[lane]) * 2 + 1) & 0xFFFFFFFF
        _WEIGHTS[key] = (odd - (odd >> 31) * 2**32).to(torch.int32).to(dtype)  # the same bits, as signed
    return _WEIGHTS[key][:n]


def tensor_fingerprint(tensor: Tensor) -> Tensor:
    """int64[2] on the tensor's device: position-weighted sums of its words (module docstring)."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    words = flat.view(torch.int32) if flat.numel() % 4 == 0 else flat
    lanes = []
    for lane in range(2):
        total = torch.zeros((), dtype=torch.int64, device=flat.device)
        for c, start in enumerate(range(0, words.numel(), _CHUNK)):
            part = words[start : start + _CHUNK]
            products = part * _odd_weights(flat.device, lane, part.dtype, part.numel())  # wraps
            total += products.sum(dtype=torch.int32).long() * (2 * c + 1)  # the sum wraps too
        lanes.append(total)
    return torch.stack(lanes)


def fingerprint_entry(name: str, tensor: Tensor) -> tuple[str, Tensor]:
    """(name with shape and dtype, fingerprint): what a checksum is built from, one tensor at a time."""
    return f"{name}:{tuple(tensor.shape)}:{tensor.dtype}", tensor_fingerprint(tensor)


def checksum_of(entries: list[tuple[str, Tensor]]) -> str:
    """Hex digest of `fingerprint_entry` results, in name order (one device->host copy for all of them)."""
    entries = sorted(entries, key=lambda item: item[0])
    host = torch.stack([fp for _, fp in entries]).cpu().numpy() if entries else None
    digest = hashlib.blake2b(digest_size=16)
    for i, (key, _) in enumerate(entries):
        digest.update(key.encode())
        digest.update(host[i].tobytes())
    return digest.hexdigest()


def weights_checksum(named_tensors: Iterable[tuple[str, Tensor]]) -> str:
    """Checksum of names, shapes, dtypes and exact bytes."""
    return checksum_of([fingerprint_entry(name, t) for name, t in named_tensors])
