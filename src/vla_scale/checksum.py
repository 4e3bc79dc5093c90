"""Fingerprints of exact weights, computed where the weights live (GPU or CPU).

A weight sync moves billions of parameters; proving that the receiver holds exactly the sender's bytes must not
copy them to the host. `tensor_fingerprint` reduces a tensor's bytes on its own device to two 64-bit sums over its
32-bit words (bytes, for tensors whose size is not a multiple of 4), each word multiplied by an odd weight that
depends on its position (int64 arithmetic wraps). A change to any single word changes both sums (an odd weight times
a non-zero difference below 2^33 is never 0 mod 2^64); several changes cancel only by coincidence. It detects bit
flips, stale or missing buckets, dtype and order mix-ups; it is not a defence against deliberate collisions.

`weights_checksum` hashes names, shapes, dtypes and fingerprints in name order: equal iff (up to that coincidence)
the weights are identical.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
from torch import Tensor

_CHUNK = 1 << 22  # words per reduction: bounds the temporary int64 tensors to 32 MB each
_WEIGHTS: dict[tuple[str, int], Tensor] = {}  # (device, lane) -> odd per-position weights of one chunk


def _odd_weights(device: torch.device, lane: int) -> Tensor:
    key = (str(device), lane)
    if key not in _WEIGHTS:
        pos = torch.arange(_CHUNK, dtype=torch.int64, device=device)
        mult = (0x9E3779B97F4A7C15 - 2**64, 0xC2B2AE3D27D4EB4F - 2**64)[lane]  # as signed int64
        _WEIGHTS[key] = (pos * mult) * 2 + 1
    return _WEIGHTS[key]


def tensor_fingerprint(tensor: Tensor) -> Tensor:
    """int64[2] on the tensor's device: position-weighted sums of its words (module docstring)."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    words = flat.view(torch.int32) if flat.numel() % 4 == 0 else flat
    out = torch.zeros(2, dtype=torch.int64, device=flat.device)
    for c, start in enumerate(range(0, words.numel(), _CHUNK)):
        part = words[start : start + _CHUNK].to(torch.int64)
        for lane in range(2):
            chunk_sum = (part * _odd_weights(flat.device, lane)[: part.numel()]).sum()
            out[lane] += chunk_sum * (2 * c + 1 + 2 * lane)
    return out


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
