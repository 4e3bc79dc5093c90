"""Weight sync: actor (DeepSpeed, possibly ZeRO-3 sharded) -> rollout engine, in buckets, proven by a checksum.

Rank layout (colocated mode): every trainer rank r holds its ZeRO shard of the actor and a full rollout-engine
replica. A sync walks the actor's parameters in name order, gathers at most `bucket_mb` of them at a time
(`deepspeed.zero.GatheredParameters`, a collective every rank joins), copies each gathered bucket into rank r's own
engine, then releases it. No rank ever holds more than one bucket of gathered parameters beyond its engine copy.
Each rank hashes what it pushed and what its engine holds afterwards; a mismatch is an error.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import deepspeed
import torch
from torch import Tensor, nn

from vla_scale.rollout.engine import RolloutEngine, weights_checksum


@dataclass
class SyncReport:
    version: int
    checksum: str
    seconds: float
    bytes: int
    buckets: int


def _param_bytes(param: nn.Parameter) -> int:
    numel = getattr(param, "ds_numel", param.numel())
    return int(numel) * param.element_size()


def gathered_buckets(module: nn.Module, bucket_mb: float) -> Iterator[list[tuple[str, Tensor]]]:
    """Yield lists of (name, full tensor), each at most `bucket_mb` (a larger single tensor is its own bucket).

    The tensors are valid only until the next item is requested: consumers copy them.
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


def sync_weights(module: nn.Module, engine: RolloutEngine, version: int, bucket_mb: float) -> SyncReport:
    """Push every parameter of `module` into `engine` bucket by bucket; raise if the checksums differ."""
    start = time.perf_counter()
    pushed: list[tuple[str, Tensor]] = []
    total = buckets = 0
    for bucket in gathered_buckets(module, bucket_mb):
        engine.update_weights_from_tensor(bucket, version)
        pushed.extend((name, _digest_tensor(name, t)) for name, t in bucket)
        total += sum(t.numel() * t.element_size() for _, t in bucket)
        buckets += 1
    actor_sum = _combine(pushed)
    engine_sum = _combine([(n, _digest_tensor(n, p)) for n, p in engine.policy.named_parameters()])
    if actor_sum != engine_sum:
        raise RuntimeError(
            f"weight sync v{version}: rollout engine checksum {engine_sum} != actor checksum {actor_sum}; "
            "the engine's weights differ from the actor's (parameter names or dtypes out of step?)"
        )
    return SyncReport(version, actor_sum, time.perf_counter() - start, total, buckets)


def _digest_tensor(name: str, tensor: Tensor) -> Tensor:
    """A tiny tensor standing for the exact bytes of `tensor` (so buckets can be hashed as they pass)."""
    digest = weights_checksum([(name, tensor)])
    return torch.frombuffer(bytearray(bytes.fromhex(digest)), dtype=torch.uint8)


def _combine(digests: list[tuple[str, Tensor]]) -> str:
    return weights_checksum(digests) if digests else hashlib.blake2b(b"", digest_size=16).hexdigest()
