"""Fingerprints of exact weights, computed where the weights live (GPU or CPU).

A weight sync moves billions of parameters; proving that the receiver holds exactly the sender's bytes must not
copy them to the host, and must cost little next to the copy itself. A tensor's bytes are read as a matrix of int32
words, `_WORDS` to a row (bytes that do not fill a row are its tail), and reduced twice by plain sums, the cheapest
passes a device makes over memory:

- its row sums and its column sums, each modulo 2^32 (int32 results; wrapping keeps them exact modulo 2^32 whatever
  the order or width of accumulation);
- lanes 0 and 1: the row sums weighted by two odd numbers per row index, plus the tail's bytes weighted by odd
  numbers per byte index; lanes 2 and 3: the column sums weighted by two odd numbers per column; all in wrapping
  int64 arithmetic.

Why a single changed byte always shows: in the body it changes one int32 word by Δ, 0 < |Δ| < 2^32, so its row sum
changes by a non-zero amount below 2^33 in magnitude, and an odd weight keeps that non-zero modulo 2^64; a tail
byte changes by 0 < |Δ| < 256, likewise. Several changes cancel only by coincidence, in all four lanes at once (two
swapped words still move the column lanes, or the row lanes). It detects bit flips, stale or missing buckets, dtype
and order mix-ups; it is not a defence against deliberate collisions.

The fingerprints of a list of tensors come from two reductions per stack of tensors of one byte length and a
handful of kernels for the whole list, so a model's thousand tensors cost little more than their bytes.
`weights_checksum` (and `Fingerprints.checksum`) hashes names, shapes, dtypes and fingerprints in name order: equal
iff (up to that coincidence) the weights are identical.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from vla_scale.tensors.spans import follows, reaches

_WORDS = 1024  # int32 words per row
_ROW = 4 * _WORDS  # bytes per row
_LANES = 4
_STACK_BYTES = 1 << 28  # bytes of equal-length tensors stacked for one reduction
# odd multipliers of the weights (weights = index * multiplier * 2 + 1, wrapping)
_ROW_MUL = (-7046029254386353131, 0x2545F4914F6CDD1D)
_TAIL_MUL = (0x5851F42D4C957F2D, -4658895280553007687)
_COL_MUL = (0x27BB2EE687B0B0FD, 0x14057B7EF767814F)


def _odd(index: Tensor, multiplier: int) -> Tensor:
    return (index + 1) * multiplier * 2 + 1


def _segments(counts: list[int], device: torch.device) -> tuple[Tensor, Tensor]:
    """For segments of the given lengths laid end to end: each element's segment and its index within it."""
    lengths = _on_device(tuple(counts), device)
    total = sum(counts)
    segment = torch.repeat_interleave(torch.arange(len(counts), device=device), lengths, output_size=total)
    starts = lengths.cumsum(0) - lengths
    return segment, torch.arange(total, device=device) - starts[segment]


_LENGTHS: dict[tuple[tuple[int, ...], str], Tensor] = {}


def _on_device(counts: tuple[int, ...], device: torch.device) -> Tensor:
    """`counts` as an int64 tensor on `device`. A copy from the host waits for the work queued on the device, so the
    tensors are kept: a weight sync asks for the same bucket layouts every time."""
    key = (counts, str(device))
    if key not in _LENGTHS:
        if len(_LENGTHS) > 4096:
            _LENGTHS.clear()
        _LENGTHS[key] = torch.tensor(counts, dtype=torch.int64, device=device)
    return _LENGTHS[key]


def _segment_sums(values: Tensor, segment: Tensor, n: int) -> Tensor:
    """Wrapping int64 sums of the rows of `values` [N, L] per segment: [n, L] (integer adds: order-free, exact)."""
    return torch.zeros((n, values.shape[1]), dtype=torch.int64, device=values.device).index_add_(0, segment, values)


def _bytes(tensor: Tensor) -> Tensor:
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return flat if flat.data_ptr() % 4 == 0 else flat.clone()  # int32 views need aligned storage


def fingerprints(tensors: Sequence[Tensor]) -> Tensor:
    """int64[len(tensors), 4] on the tensors' device (module docstring); all tensors on one device.

    Tensors of equal byte length are reduced together, a few hundred MB at a time (as they lie, where they lie end to
    end; else stacked): a model's weights come in few distinct sizes, so a thousand tensors take tens of reductions,
    not thousands."""
    if not tensors:
        return torch.zeros((0, _LANES), dtype=torch.int64)
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        raise ValueError("fingerprints: all tensors must be on one device")
    flats = [_bytes(t) for t in tensors]
    by_length: dict[int, list[int]] = {}
    for i, flat in enumerate(flats):
        by_length.setdefault(flat.numel(), []).append(i)
    order: list[int] = []  # tensor indices in the order reduced
    row_parts: list[Tensor] = []
    col_parts: list[Tensor] = []
    for length, members in by_length.items():
        n = length // _ROW
        for part, body in _bodies(flats, members, n * _ROW):
            order += part
            if body is None:
                col_parts.append(torch.zeros((len(part), _WORDS), dtype=torch.int32, device=device))
                continue
            body = body.view(torch.int32).view(len(part), n, _WORDS)
            row_parts.append(body.sum(dim=2, dtype=torch.int32).reshape(-1))
            col_parts.append(body.sum(dim=1, dtype=torch.int32))
    flats = [flats[i] for i in order]
    rows = [f.numel() // _ROW for f in flats]
    out = torch.zeros((len(flats), _LANES), dtype=torch.int64, device=device)
    if row_parts:
        segment, index = _segments(rows, device)
        row_sums = torch.cat(row_parts).to(torch.int64)[:, None]
        out[:, :2] += _segment_sums(row_sums * torch.stack([_odd(index, m) for m in _ROW_MUL], 1), segment, len(flats))
    columns = torch.arange(_WORDS, dtype=torch.int64, device=device)
    col_weights = torch.stack([_odd(columns, m) for m in _COL_MUL], 1)  # [_WORDS, 2]
    out[:, 2:] = (torch.cat(col_parts).to(torch.int64)[:, :, None] * col_weights).sum(1)
    tails = [flat[n * _ROW :] for flat, n in zip(flats, rows, strict=True)]
    lengths = [t.numel() for t in tails]
    if sum(lengths):
        segment, index = _segments(lengths, device)
        values = torch.cat(tails).to(torch.int64)[:, None] * torch.stack([_odd(index, m) for m in _TAIL_MUL], 1)
        out[:, :2] += _segment_sums(values, segment, len(flats))
    if order == sorted(order):
        return out
    return torch.empty_like(out).index_copy_(0, _on_device(tuple(order), device), out)


def _bodies(flats: list[Tensor], members: list[int], size: int) -> Iterator[tuple[list[int], Tensor | None]]:
    """The first `size` bytes of each member as rows of uint8[k, size] matrices of at most `_STACK_BYTES`: a view
    where the members lie end to end in memory (the rollout engine's weights), a stack of copies for the rest. None
    when `size` is 0."""
    if not size:
        yield members, None
        return
    per_matrix = max(1, _STACK_BYTES // size)
    runs: list[list[int]] = []
    for i in members:
        before = flats[runs[-1][-1]] if runs else None
        if before is not None and len(runs[-1]) < per_matrix and before.numel() == size and follows(before, flats[i]):
            runs[-1].append(i)  # right after a body with no tail
        else:
            runs.append([i])
    loose = [run[0] for run in runs if len(run) == 1]
    for run in runs:
        if len(run) > 1 and reaches(flats[run[0]], flats[run[-1]]):
            first = flats[run[0]]
            yield run, first.as_strided((len(run), size), (size, 1), first.storage_offset())
        elif len(run) > 1:
            loose += run
    for at in range(0, len(loose), per_matrix):
        part = loose[at : at + per_matrix]
        yield part, torch.stack([flats[i][:size] for i in part]) if len(part) > 1 else flats[part[0]][:size][None]


def _key(name: str, tensor: Tensor) -> str:
    return f"{name}:{tuple(tensor.shape)}:{tensor.dtype}"


class Fingerprints:
    """Fingerprints of named tensors collected batch by batch (a weight sync's buckets) into one checksum: keys
    (name, shape, dtype) on the host, one int64[n, 4] tensor per batch on the device, read back once."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.batches: list[Tensor] = []

    def add(self, named: Sequence[tuple[str, Tensor]]) -> None:
        if named:
            self.keys += [_key(name, t) for name, t in named]
            self.batches.append(fingerprints([t for _, t in named]))

    def on_host(self) -> tuple[list[str], np.ndarray]:
        """The keys and their fingerprints int64[n, 4], in one device->host copy (one per batch if on several)."""
        if not self.batches:
            return self.keys, np.zeros((0, _LANES), np.int64)
        if len({batch.device for batch in self.batches}) == 1:
            return self.keys, torch.cat(self.batches).cpu().numpy()
        return self.keys, np.concatenate([batch.cpu().numpy() for batch in self.batches])

    def checksum(self) -> str:
        """Hex digest of the keys and fingerprints, in key order."""
        return digest_of(*self.on_host())


def digest_of(keys: list[str], prints: np.ndarray) -> str:
    """Hex digest of keys and their fingerprints, in key order."""
    digest = hashlib.blake2b(digest_size=16)
    for i in sorted(range(len(keys)), key=keys.__getitem__):
        digest.update(keys[i].encode())
        digest.update(prints[i].tobytes())
    return digest.hexdigest()


def weights_checksum(named_tensors: Iterable[tuple[str, Tensor]]) -> str:
    """Checksum of names, shapes, dtypes and exact bytes."""
    by_device: dict[torch.device, list[tuple[str, Tensor]]] = {}
    for name, tensor in named_tensors:
        by_device.setdefault(tensor.device, []).append((name, tensor))
    prints = Fingerprints()
    for group in by_device.values():
        prints.add(group)
    return prints.checksum()
