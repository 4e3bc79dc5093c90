"""Weight sync: actor (DeepSpeed, possibly ZeRO-3 sharded) -> rollout engine, in buckets, proven by a checksum.

Rank layout (colocated mode): every trainer rank r holds its ZeRO shard of the actor and a full rollout-engine
replica. A sync walks the actor's parameters in name order, gathers at most `bucket_mb` of them at a time
(`deepspeed.zero.GatheredParameters`, a collective every rank joins), copies each gathered bucket into rank r's own
engine, then releases it. No rank ever holds more than one bucket of gathered parameters beyond its engine copy.
Each rank checks that its engine's copy of every tensor is bit-identical to the gathered one (a mismatch is an
error) and fingerprints its share of the tensors; the shares form one checksum of the whole model (`checksum.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import deepspeed
import torch
import torch.distributed as dist
from torch import Tensor, nn

from vla_scale.checksum import checksum_of, fingerprint_entry

if TYPE_CHECKING:
    from vla_scale.rollout.engine import RolloutEngine


@dataclass
class SyncReport:
    version: int
    checksum: str
    seconds: float  # the whole sync: gathers, copies and the checksum comparison
    bytes: int
    buckets: int
    verify_seconds: float = 0.0  # of which: fingerprinting the engine's weights and comparing


def _param_bytes(param: nn.Parameter) -> int:
    numel = getattr(param, "ds_numel", param.numel())
    return int(numel) * param.element_size()


def gathered_buckets(module: nn.Module, bucket_mb: float) -> Iterator[list[tuple[str, Tensor]]]:
    """Yield lists of (name, full tensor), each at most `bucket_mb` (a larger single tensor is its own bucket).

    The tensors are valid only until the next item is requested: consumers copy them. Under ZeRO-3 every trainer
    rank must walk the same buckets (each gather is a collective).
    """
    limit = bucket_mb * 2**20
    bucket: list[tuple[str, nn.Parameter]] = []
    size = 0
    for name, param in module.named_parameters():
        if bucket and size + _param_bytes(param) > limit:
            yield from _gather(bucket)
            bucket, size = [], 0
        bucket.append((name, param))
        size += _param_bytes(param)
    if bucket:
        yield from _gather(bucket)


def _gather(bucket: list[tuple[str, nn.Parameter]]) -> Iterator[list[tuple[str, Tensor]]]:
    params = [p for _, p in bucket]
    if not any(hasattr(p, "ds_id") for p in params):
        yield [(name, p.data) for name, p in bucket]
    elif _one_collective_possible(params):
        yield _gather_flat(bucket)
    else:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield [(name, p.data) for name, p in bucket]


def _one_collective_possible(params: list[nn.Parameter]) -> bool:
    """All shards in device memory of one dtype, over one process group (not offloaded to the CPU under NCCL)."""
    shards = [p.ds_tensor for p in params]
    if len({(t.dtype, t.device) for t in shards}) != 1 or len({id(p.ds_process_group) for p in params}) != 1:
        return False
    on_cpu = shards[0].device.type == "cpu"
    return not on_cpu or dist.get_backend(params[0].ds_process_group) == "gloo"


def _gather_flat(bucket: list[tuple[str, nn.Parameter]]) -> list[tuple[str, Tensor]]:
    """The bucket's full tensors from one all-gather of all its ZeRO-3 shards (instead of one gather per parameter).

    ZeRO-3 splits each flattened parameter into `world` equal shards (the last one padded), shard r on rank r
    (`param.ds_tensor`). Every rank concatenates its shards of the bucket; after the all-gather, row r of the result
    holds rank r's, and parameter p is the concatenation of its column range over the rows, cut to its size.
    """
    group = bucket[0][1].ds_process_group
    shards = [p.ds_tensor.reshape(-1) for _, p in bucket]
    local = torch.cat(shards)
    world = dist.get_world_size(group)
    rows = torch.empty(world * local.numel(), dtype=local.dtype, device=local.device)
    dist.all_gather_into_tensor(rows, local, group=group)
    rows = rows.view(world, local.numel())
    out, offset = [], 0
    for (name, param), shard in zip(bucket, shards, strict=True):
        full = rows[:, offset : offset + shard.numel()].reshape(-1)[: param.ds_numel]
        out.append((name, full.view(param.ds_shape)))
        offset += shard.numel()
    return out


class Fingerprints:
    """Collects the fingerprints of what was sent, bucket by bucket, into one checksum."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, Tensor]] = []

    def add(self, bucket: list[tuple[str, Tensor]]) -> None:
        self.entries.extend(fingerprint_entry(name, t) for name, t in bucket)

    def checksum(self) -> str:
        return checksum_of(self.entries)


def sync_weights(module: nn.Module, engine: RolloutEngine, version: int, bucket_mb: float,
                 verify: bool = True) -> SyncReport:
    """Push every parameter of `module` into `engine` bucket by bucket; raise if any copy is not exact.

    With `verify`, each rank compares every tensor its engine received with the gathered original bit for bit, and
    fingerprints its share of them (tensor i on rank i mod world; every rank's copy is the same exact bytes); the
    shares are all-gathered into one checksum of the whole model, the same on every rank. Without it the report's
    checksum is empty."""
    start = time.perf_counter()
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = Fingerprints()
    names: list[str] = []
    differs: list[Tensor] = []  # one device flag per tensor, read once at the end (no sync per tensor)
    total = buckets = index = 0
    engine_params = dict(engine.policy.named_parameters())
    verify_s = 0.0
    for bucket in gathered_buckets(module, bucket_mb):
        engine.update_weights_from_tensor(bucket, version)
        total += sum(t.numel() * t.element_size() for _, t in bucket)
        buckets += 1
        if not verify:
            continue
        t0 = time.perf_counter()
        names += [name for name, _ in bucket]
        differs += [_differs(engine_params[name], t) for name, t in bucket]
        mine.add([(name, engine_params[name]) for i, (name, _) in enumerate(bucket, index) if i % world == rank])
        verify_s += time.perf_counter() - t0
        index += len(bucket)
    if not verify:
        engine.synchronize()
        return SyncReport(version, "", time.perf_counter() - start, total, buckets)
    t0 = time.perf_counter()
    checksum = mine.checksum() if world == 1 else _all_ranks_checksum(mine)
    wrong = [name for name, bad in zip(names, torch.stack(differs).tolist(), strict=True) if bad]
    if wrong:
        raise RuntimeError(
            f"weight sync v{version}: the rollout engine's copies of {wrong[:3]} ({len(wrong)} tensors) differ from "
            f"the actor's gathered weights (engine checksum {checksum}): parameter dtypes out of step?"
        )
    end = time.perf_counter()
    return SyncReport(version, checksum, end - start, total, buckets, verify_s + end - t0)


def _differs(a: Tensor, b: Tensor) -> Tensor:
    """A device bool: do the two tensors differ in dtype, shape or any bit?"""
    if a.dtype != b.dtype or a.shape != b.shape:
        return torch.ones((), dtype=torch.bool, device=a.device)
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return (a.reshape(-1).view(as_int) != b.detach().reshape(-1).view(as_int)).any()


def _all_ranks_checksum(mine: Fingerprints) -> str:
    shares: list = [None] * dist.get_world_size()
    dist.all_gather_object(shares, [(key, fp.cpu()) for key, fp in mine.entries])
    return checksum_of([entry for share in shares for entry in share])
