"""Weight sync: actor (DeepSpeed, possibly ZeRO-3 sharded) -> rollout engine, in buckets, proven by a checksum.

Rank layout (colocated mode): every trainer rank r holds its ZeRO shard of the actor and a full rollout-engine
replica. A sync walks the actor's parameters in name order, gathers at most `bucket_mb` of them at a time (one
coalesced all-gather of the bucket's ZeRO-3 shards, a collective every rank joins), copies each gathered bucket into
rank r's own engine, then releases it; the next bucket's all-gather runs while this one is copied and checked. No
rank ever holds more than two buckets of gathered parameters beyond its engine copy. Each rank checks that its
engine's copy of every tensor is bit-identical to the gathered one (a mismatch is an error) and fingerprints its
share of the tensors; the shares form one checksum of the whole model (`checksum.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.distributed_c10d import _coalescing_manager

from vla_scale.tensors.checksum import Fingerprints, digest_of
from vla_scale.tensors.spans import span


class WeightTarget(Protocol):
    """What a sync writes into (the rollout engine): its parameters by name, a bucket copy, a device barrier, the
    fingerprint of what it holds (`checksum.weights_checksum`) and a hold on its readers for one whole sync."""

    weights: dict[str, Tensor]

    def receiving(self) -> AbstractContextManager[None]: ...

    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None: ...

    def synchronize(self) -> None: ...

    def checksum(self) -> str: ...


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


def gathered_buckets(module: nn.Module, bucket_mb: float, only: Callable[[str], bool] | None = None
                     ) -> Iterator[list[tuple[str, Tensor]]]:
    """Yield lists of (name, full tensor), each at most `bucket_mb` (a larger single layer is its own bucket; a
    layer's parameters, its LoRA adapters' included, always share one).

    The tensors are valid only until the next item is requested: consumers copy them. Under ZeRO-3 every trainer
    rank must walk the same buckets (each gather is a collective). While the consumer works on one bucket, the next
    one's all-gather is already in flight (`_FlatGather`), so at most two buckets are gathered at a time. A module
    with a `served(bucket)` method (the policy: LoRA adapters merged) gets each bucket as it serves it; `only` instead
    selects parameters by name and yields them as they are.
    """
    for bucket in _gathered(_bucket_plan(module, bucket_mb, only)):
        serve = getattr(module, "served", None)
        yield serve(bucket) if only is None and callable(serve) else bucket


def _gathered(plan: list[list[tuple[str, nn.Parameter]]]) -> Iterator[list[tuple[str, Tensor]]]:
    ahead: _FlatGather | None = None
    try:
        for i, bucket in enumerate(plan):
            current = ahead or _start(bucket)
            following = plan[i + 1] if i + 1 < len(plan) else None
            flat_next = following and isinstance(current, _FlatGather) and _flat(following)
            ahead = _FlatGather(following) if flat_next else None
            if isinstance(current, _FlatGather):
                yield current.result()
            else:
                yield from current
    finally:  # a consumer that stops early (an error, a failed check) must not free a buffer a gather still fills
        if ahead is not None:
            ahead.work.wait()


def _bucket_plan(module: nn.Module, bucket_mb: float, only: Callable[[str], bool] | None = None
                 ) -> list[list[tuple[str, nn.Parameter]]]:
    if not bucket_mb > 0:
        raise ValueError(f"bucket_mb={bucket_mb} must be > 0 (sync.bucket_mb)")
    limit = bucket_mb * 2**20
    plan: list[list[tuple[str, nn.Parameter]]] = [[]]
    size = 0
    for name, param in module.named_parameters():
        if only is not None and not only(name):
            continue
        same_layer = bool(plan[-1]) and _layer(plan[-1][-1][0]) == _layer(name)
        if plan[-1] and size + _param_bytes(param) > limit and not same_layer:
            plan.append([])
            size = 0
        plan[-1].append((name, param))
        size += _param_bytes(param)
    return plan if plan[-1] else []


def _layer(name: str) -> str:
    """The layer a parameter belongs to, whose parameters share a bucket: its module's, where a LoRA factor
    (`<layer>.lora_A.weight`) counts as its layer's (the policy serves them merged into the layer's weight)."""
    module = name.rsplit(".", 1)[0]
    return module.removesuffix(".lora_A").removesuffix(".lora_B")


def _start(bucket: list[tuple[str, nn.Parameter]]) -> _FlatGather | Iterator[list[tuple[str, Tensor]]]:
    return _FlatGather(bucket) if _flat(bucket) else _gather(bucket)


def _gather(bucket: list[tuple[str, nn.Parameter]]) -> Iterator[list[tuple[str, Tensor]]]:
    params = [p for _, p in bucket]
    if not any(hasattr(p, "ds_id") for p in params):
        yield [(name, p.data) for name, p in bucket]
    else:
        import deepspeed  # seconds to import: only where ZeRO-3 shards are gathered

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield [(name, p.data) for name, p in bucket]


def _flat(bucket: list[tuple[str, nn.Parameter]]) -> bool:
    """ZeRO-3 shards all in device memory, of one dtype, over one process group (not offloaded to the CPU under
    NCCL): one all-gather can fetch them."""
    params = [p for _, p in bucket]
    if not all(hasattr(p, "ds_id") for p in params):
        return False
    shards = [p.ds_tensor for p in params]
    if len({(t.dtype, t.device) for t in shards}) != 1 or len({id(p.ds_process_group) for p in params}) != 1:
        return False
    on_cpu = shards[0].device.type == "cpu"
    return not on_cpu or dist.get_backend(params[0].ds_process_group) == "gloo"


class _FlatGather:
    """A bucket's full tensors from one coalesced all-gather of its ZeRO-3 shards (instead of DeepSpeed's gather per
    parameter), started at construction and waited for in `result`.

    ZeRO-3 splits each flattened parameter into `world` equal shards (the last one padded), shard r on rank r
    (`param.ds_tensor`). Each parameter's shards are gathered into its own stretch of one buffer, rank after rank:
    the first `ds_numel` elements of the stretch are the whole parameter, usable in place (no copy, no
    concatenation). The gathers of a bucket go out as one group (`_coalescing_manager`): one launch, one wait.
    """

    def __init__(self, bucket: list[tuple[str, nn.Parameter]]):
        self.bucket = bucket
        group = bucket[0][1].ds_process_group
        world = dist.get_world_size(group)
        shards = [p.ds_tensor.reshape(-1) for _, p in bucket]
        sizes = [world * shard.numel() for shard in shards]
        self.buffer = torch.empty(sum(sizes), dtype=shards[0].dtype, device=shards[0].device)
        self.outputs = list(torch.split(self.buffer, sizes))
        with _coalescing_manager(group, async_ops=True) as self.work:
            for out, shard in zip(self.outputs, shards, strict=True):
                dist.all_gather_into_tensor(out, shard, group=group)

    def result(self) -> list[tuple[str, Tensor]]:
        self.work.wait()
        return [(name, out[: param.ds_numel].view(param.ds_shape))
                for (name, param), out in zip(self.bucket, self.outputs, strict=True)]


def sync_weights(module: nn.Module, engine: WeightTarget, version: int, bucket_mb: float,
                 verify: bool = True) -> SyncReport:
    """Push every parameter of `module` into `engine` bucket by bucket; raise if any copy is not exact.

    With `verify`, each rank compares every tensor its engine received with the gathered original bit for bit, and
    fingerprints its share of each bucket (`_share`; every rank's copy is the same exact bytes) while the next bucket
    is gathered; the shares are all-gathered into one checksum of the whole model, the same on every rank. Without
    it the report's checksum is empty."""
    with engine.receiving():  # no decode sees a bucket before the whole sync has landed
        return _sync_weights(module, engine, version, bucket_mb, verify)


def _sync_weights(module: nn.Module, engine: WeightTarget, version: int, bucket_mb: float, verify: bool
                  ) -> SyncReport:
    start = time.perf_counter()
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = Fingerprints()
    groups: list[list[str]] = []
    differs: list[Tensor] = []  # one device flag per group of tensors, read once at the end (no sync per bucket)
    total = buckets = 0
    engine_params = engine.weights
    verify_s = 0.0
    for bucket in gathered_buckets(module, bucket_mb):
        engine.update_weights_from_tensor(bucket, version)
        total += sum(t.numel() * t.element_size() for _, t in bucket)
        buckets += 1
        if not verify:
            continue
        t0 = time.perf_counter()
        for group, flag in _compare(bucket, engine_params):
            groups.append(group)
            differs.append(flag)
        mine.add([(name, engine_params[name]) for name in _share(bucket, rank, world)])
        verify_s += time.perf_counter() - t0
    if not verify:
        engine.synchronize()
        return SyncReport(version, "", time.perf_counter() - start, total, buckets)
    t0 = time.perf_counter()
    checksum = mine.checksum() if world == 1 else _all_ranks_checksum(mine)
    wrong = [group for group, bad in zip(groups, torch.stack(differs).tolist(), strict=True) if bad]
    if wrong:
        names = [name for group in wrong for name in group]
        raise RuntimeError(
            f"weight sync v{version}: the rollout engine's copies of {names[:3]} (in {len(wrong)} group(s) of "
            f"{len(names)} tensors) differ from the actor's gathered weights (engine checksum {checksum}): parameter "
            "dtypes out of step?"
        )
    end = time.perf_counter()
    return SyncReport(version, checksum, end - start, total, buckets, verify_s + end - t0)


def _share(bucket: list[tuple[str, Tensor]], rank: int, world: int) -> list[str]:
    """The tensors of a bucket that this rank fingerprints: a run of consecutive ones holding about 1/world of its
    bytes (each tensor goes to the rank its middle byte falls to), so that they lie end to end in the engine."""
    sizes = [t.numel() * t.element_size() for _, t in bucket]
    total, at, names = max(sum(sizes), 1), 0, []
    for (name, _), size in zip(bucket, sizes, strict=True):
        if min((2 * at + size) * world // (2 * total), world - 1) == rank:
            names.append(name)
        at += size
    return names


def _compare(bucket: list[tuple[str, Tensor]], engine_params: dict[str, Tensor]) -> list[tuple[list[str], Tensor]]:
    """Device flags: does the engine's copy differ from the gathered tensor in dtype, shape or any bit? One flag per
    group of tensors of one dtype (their bytes compared end to end as wide integers: a few kernels per bucket, not a
    few per tensor), and one per tensor of the wrong dtype or shape."""
    out: list[tuple[list[str], Tensor]] = []
    groups: dict[tuple[torch.dtype, torch.device], list[tuple[str, Tensor, Tensor]]] = {}
    for name, sent in bucket:
        held = engine_params[name]
        if held.dtype != sent.dtype or held.shape != sent.shape:
            out.append(([name], torch.ones((), dtype=torch.bool, device=held.device)))
        else:
            groups.setdefault((held.dtype, held.device), []).append((name, held, sent))
    for items in groups.values():
        held = _end_to_end([h.detach() for _, h, _ in items])
        sent = _end_to_end([t.detach() for _, _, t in items]).to(held.device)
        out.append(([name for name, _, _ in items], (_as_words(held) != _as_words(sent)).any()))
    return out


def _end_to_end(tensors: list[Tensor]) -> Tensor:
    """The tensors' elements end to end, 1-D: a view when they already lie so (`spans.span`), else a concatenation."""
    whole = span(tensors)
    return whole if whole is not None else torch.cat([t.reshape(-1) for t in tensors])


def _as_words(flat: Tensor) -> Tensor:
    """A 1-D tensor's bytes as the widest integers that divide them (fewer, wider elements to compare)."""
    raw = flat.view(torch.uint8)
    for word in (torch.int64, torch.int32, torch.int16):
        if raw.numel() % word.itemsize == 0 and raw.data_ptr() % word.itemsize == 0:
            return raw.view(word)
    return raw


def _all_ranks_checksum(mine: Fingerprints) -> str:
    """One checksum of every rank's share: keys and fingerprints travel as a list and one array per rank (pickling
    a thousand small tensors instead took a good part of a sync)."""
    shares: list = [None] * dist.get_world_size()
    dist.all_gather_object(shares, mine.on_host())
    return digest_of([key for keys, _ in shares for key in keys], np.concatenate([prints for _, prints in shares]))
