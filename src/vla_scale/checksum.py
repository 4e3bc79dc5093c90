"""Fingerprints of exact weights, computed where the weights live (GPU or CPU).

A weight sync moves billions of parameters; proving that the receiver holds exactly the sender's bytes must not
copy them to the host, and must cost little next to the copy itself. `tensor_fingerprint` reads a tensor's bytes
once, as a matrix of int8 rows of `_ROW` bytes, and multiplies it by a fixed int8 matrix of odd weights [_ROW, 8]
with an exact integer matrix product (`torch._int_mm`, int32 results: no overflow at this row length); the 8 column
sums of each row are then weighted by an odd number per row and added up in wrapping int64 arithmetic. Bytes that do
not fill a row (and tensors too small for the matrix product) are weighted and summed one by one into lanes 0 and 1.

Why a single changed byte always shows: its change Δ (0 < |Δ| < 256) moves each of its row's 8 products by Δ times
an odd weight, a non-zero amount below 2^15, and an odd row weight keeps that non-zero mod 2^64. Several changes
cancel only by coincidence, in all 8 lanes at once. It detects bit flips, stale or missing buckets, dtype and order
mix-ups; it is not a defence against deliberate collisions.

`weights_checksum` hashes names, shapes, dtypes and fingerprints in name order: equal iff (up to that coincidence)
the weights are identical.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
from torch import Tensor

_ROW = 4096  # bytes per row of the matrix product
_MIN_ROWS = 32  # the int8 matrix product wants more than 16 rows
_LANES = 8
_TABLES: dict[tuple[str, str], Tensor] = {}


def _table(device: torch.device, kind: str, n: int) -> Tensor:
    """Deterministic odd weights: 'cols' int8[_ROW, 8], 'rows' int64[n] (grown as needed), 'bytes' int64[n]."""
    key = (str(device), kind)
    table = _TABLES.get(key)
    if table is None or table.shape[0] < n:
        pos = torch.arange(max(n, 1 << 12), dtype=torch.int64, device=device)
        if kind == "cols":
            lane = torch.arange(_LANES, dtype=torch.int64, device=device)
            mixed = (pos[:_ROW, None] * 2654435761 + lane * 40503 + 12345) % 127
            table = (mixed * 2 - 127).to(torch.int8)  # odd values in [-127, 125]
        else:
            table = pos * (-7046029254386353131 if kind == "rows" else 0x2545F4914F6CDD1D) * 2 + 1  # wraps; odd
        _TABLES[key] = table
    return table[:n]


def _by_bytes(data: Tensor) -> Tensor:
    """int64[2]: odd-weighted sums of single bytes (for what the matrix product does not cover)."""
    weights = _table(data.device, "bytes", data.numel())
    values = data.to(torch.int64)
    return torch.stack([(values * weights).sum(), (values * (weights * 5 + 2)).sum()])


def tensor_fingerprint(tensor: Tensor) -> Tensor:
    """int64[8] on the tensor's device (module docstring)."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    rows = flat.numel() // _ROW if flat.numel() >= _ROW * _MIN_ROWS else 0
    out = torch.zeros(_LANES, dtype=torch.int64, device=flat.device)
    if rows:
        matrix = flat[: rows * _ROW].view(torch.int8).view(rows, _ROW)
        products = torch._int_mm(matrix, _table(flat.device, "cols", _ROW))  # int32[rows, 8], exact
        out += (products.to(torch.int64) * _table(flat.device, "rows", rows)[:, None]).sum(dim=0)
    tail = flat[rows * _ROW :]
    if tail.numel():
        out[:2] += _by_bytes(tail)
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
