"""Weight sync: actor (DeepSpeed, possibly ZeRO-3 sharded) -> rollout engine, in buckets, proven by a checksum.

Rank layout (colocated mode): every trainer rank r holds its ZeRO shard of the actor and a full rollout-engine
replica. A sync walks the actor's parameters in name order, gathers at most `bucket_mb` of them at a time
(`deepspeed.zero.GatheredParameters`, a collective every rank joins), copies each gathered bucket into rank r's own
engine, then releases it. No rank ever holds more than one bucket of gathered parameters beyond its engine copy.
Each rank hashes what it pushed and what its engine holds afterwards; a mismatch is an error.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import deepspeed
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
    sharded = any(hasattr(p, "ds_id") for p in params)
    if sharded:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield [(name, p.data) for name, p in bucket]
    else:
        yield [(name, p.data) for name, p in bucket]


class Fingerprints:
    """Collects the fingerprints of what was sent, bucket by bucket, into one checksum."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, Tensor]] = []

    def add(self, bucket: list[tuple[str, Tensor]]) -> None:
        self.entries.extend(fingerprint_entry(name, t) for name, t in bucket)

    def checksum(self) -> str:
        return checksum_of(self.entries)


def sync_weights(module: nn.Module, engine: RolloutEngine, version: int, bucket_mb: float) -> SyncReport:
    """Push every parameter of `module` into `engine` bucket by bucket; raise if the checksums differ."""
    start = time.perf_counter()
    sent = Fingerprints()
    total = buckets = 0
    for bucket in gathered_buckets(module, bucket_mb):
        engine.update_weights_from_tensor(bucket, version)
        sent.add(bucket)
        total += sum(t.numel() * t.element_size() for _, t in bucket)
        buckets += 1
    verify_start = time.perf_counter()
    actor_sum, engine_sum = sent.checksum(), engine.checksum()
    if actor_sum != engine_sum:
        raise RuntimeError(
            f"weight sync v{version}: rollout engine checksum {engine_sum} != actor checksum {actor_sum}; "
            "the engine's weights differ from the actor's (parameter names or dtypes out of step?)"
        )
    end = time.perf_counter()
    return SyncReport(version, actor_sum, end - start, total, buckets, end - verify_start)
