"""Weight sync into rollout engines that live in other processes: a process group of their own with the trainer.

Rank layout of an update group (world size = 1 + number of engine processes):

    group rank 0                 trainer rank 0, the only sender
    group ranks 1 .. E           engine processes, one engine each; engine process i joins with `rank_offset` = i

Trainer ranks 1 .. N-1 are not members: under ZeRO-3 they join each bucket's gather on the trainer's own default
group (a collective over all trainer ranks) and drop it, while rank 0 broadcasts the gathered bucket to the update
group. The group is built from its own TCPStore at `master_address:master_port`, hosted by trainer rank 0, so it is
independent of the trainer's default group and of anything the engine processes run among themselves.

One sync, as every member sees it: for each bucket a header (names, dtypes, shapes, policy version) then the
bucket's bytes as one flat uint8 tensor, both broadcast from rank 0; then a closing header with the sender's
checksum, and an all-gather of every member's own checksum, so a mismatch is raised on the trainer and on the engine.
The engine side is a `WeightReceiver`: it joins the group and writes each bucket into the engine it wraps through
`update_weights_from_tensor`, so the engine itself knows nothing of the transport.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from vla_scale.parallel.sync.weight_sync import SyncReport, WeightTarget, gathered_buckets
from vla_scale.tensors.checksum import Fingerprints


@dataclass
class UpdateGroup:
    """A process group between trainer rank 0 (group rank 0) and engine processes (module docstring)."""

    group: Any  # a torch ProcessGroup backend (Gloo or NCCL) built directly from the store
    store: Any
    rank: int
    world_size: int
    device: torch.device

    @classmethod
    def connect(cls, master_address: str, master_port: int, rank: int, world_size: int, backend: str = "gloo",
                group_name: str = "weight_update", timeout_s: float = 600.0) -> UpdateGroup:
        """Join (rank 0: host) the group; returns once every member has joined."""
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(master_address, master_port, world_size, is_master=rank == 0, timeout=timeout)
        prefixed = dist.PrefixStore(group_name, store)
        if backend == "gloo":
            group, device = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout), torch.device("cpu")
        elif backend == "nccl":
            group, device = dist.ProcessGroupNCCL(prefixed, rank, world_size), torch.device("cuda")
        else:
            raise ValueError(f"weight update group backend {backend!r}: use 'gloo' (CPU) or 'nccl' (GPU)")
        member = cls(group, store, rank, world_size, device)
        member.barrier()
        return member

    def broadcast(self, tensor: Tensor) -> Tensor:
        """In place from group rank 0."""
        self.group.broadcast(tensor, 0).wait()
        return tensor

    def broadcast_object(self, obj: Any = None) -> Any:
        """Pickled `obj` from rank 0 to every member (others pass nothing and get it back)."""
        payload = pickle.dumps(obj) if self.rank == 0 else b""
        size = self.broadcast(torch.tensor([len(payload)], dtype=torch.int64, device=self.device))
        buffer = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        if self.rank == 0:
            buffer.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        return pickle.loads(self.broadcast(buffer).cpu().numpy().tobytes())

    def all_gather_text(self, text: str) -> list[str]:
        """Every member's short ASCII string (checksums), in group rank order."""
        mine = torch.zeros(64, dtype=torch.uint8, device=self.device)
        mine[: len(text)] = torch.tensor(list(text.encode()), dtype=torch.uint8)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        self.group.allgather([out], [mine]).wait()
        return [bytes(t.cpu().tolist()).rstrip(b"\0").decode() for t in out]

    def barrier(self) -> None:
        self.all_gather_text("ready")


def _flatten(bucket: list[tuple[str, Tensor]], device: torch.device) -> Tensor:
    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8).to(device) for _, t in bucket])


def _nbytes(dtype_name: str, shape: tuple[int, ...]) -> int:
    dtype = getattr(torch, dtype_name.removeprefix("torch."))
    return int(torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size()


def bucket_nbytes(dtypes: list[str], shapes: list[tuple[int, ...]]) -> int:
    """Size of the flat bucket a header announces."""
    return sum(_nbytes(d, s) for d, s in zip(dtypes, shapes, strict=True))


def unflatten(flat: Tensor, names: list[str], dtypes: list[str], shapes: list[tuple[int, ...]]):
    """The (name, tensor) views of a received flat bucket, in the order the header lists them."""
    out, offset = [], 0
    for name, dtype_name, shape in zip(names, dtypes, shapes, strict=True):
        nbytes = _nbytes(dtype_name, shape)
        dtype = getattr(torch, dtype_name.removeprefix("torch."))
        out.append((name, flat[offset : offset + nbytes].view(dtype).view(shape)))
        offset += nbytes
    return out


def broadcast_sync(module: nn.Module, group: UpdateGroup | None, version: int, bucket_mb: float) -> SyncReport:
    """Trainer side, on every trainer rank: gather `module` in buckets; rank 0 (`group` given) broadcasts each.

    Raises on the sender if any engine's checksum differs from the actor's; returns the report on rank 0
    (on other ranks a report without checksum).
    """
    start = time.perf_counter()
    sent = Fingerprints()
    total = buckets = 0
    for bucket in gathered_buckets(module, bucket_mb):
        total += sum(t.numel() * t.element_size() for _, t in bucket)
        buckets += 1
        if group is None:
            continue
        header = {"names": [n for n, _ in bucket], "dtypes": [str(t.dtype) for _, t in bucket],
                  "shapes": [tuple(t.shape) for _, t in bucket], "version": version}
        group.broadcast_object(header)
        group.broadcast(_flatten(bucket, group.device))
        sent.add(bucket)
    if group is None:
        return SyncReport(version, "", time.perf_counter() - start, total, buckets)
    verify_start = time.perf_counter()
    checksum = sent.checksum()
    group.broadcast_object({"done": True, "checksum": checksum, "version": version})
    _compare(group.all_gather_text(checksum), checksum, version)
    end = time.perf_counter()
    return SyncReport(version, checksum, end - start, total, buckets, end - verify_start)


@dataclass
class WeightReceiver:
    """An engine process's member of an update group: receives what trainer rank 0 broadcasts into `engine`."""

    engine: WeightTarget
    group: UpdateGroup

    @classmethod
    def connect(cls, engine: WeightTarget, master_address: str, master_port: int, rank_offset: int,
                world_size: int, backend: str = "gloo", group_name: str = "weight_update") -> WeightReceiver:
        """Join the trainer's update group as group rank `rank_offset`; returns once every member has joined."""
        group = UpdateGroup.connect(master_address, master_port, rank_offset, world_size, backend, group_name)
        return cls(engine, group)

    @torch.no_grad()
    def receive_bucket(self, names: list[str], dtypes: list[str], shapes: list[tuple[int, ...]],
                       version: int) -> int:
        """One bucket the trainer's rank 0 broadcasts, copied into the engine; returns its size in bytes."""
        flat = self.group.broadcast(torch.empty(bucket_nbytes(dtypes, shapes), dtype=torch.uint8,
                                                device=self.group.device))
        self.engine.update_weights_from_tensor(unflatten(flat, names, dtypes, shapes), version)
        return flat.numel()

    def receive_sync(self) -> SyncReport:
        """One whole sync from the trainer's rank 0: headers, buckets, then the checksum comparison (no decode of
        the engine runs in between)."""
        with self.engine.receiving():
            return self._receive_sync()

    def _receive_sync(self) -> SyncReport:
        start = time.perf_counter()
        total = buckets = 0
        while True:
            header = self.group.broadcast_object()
            if header.get("done"):
                break
            total += self.receive_bucket(header["names"], header["dtypes"], header["shapes"], header["version"])
            buckets += 1
        verify_start = time.perf_counter()
        mine = self.engine.checksum()
        _compare(self.group.all_gather_text(mine), header["checksum"], header["version"])
        end = time.perf_counter()
        return SyncReport(header["version"], mine, end - start, total, buckets, end - verify_start)


def _compare(checksums: list[str], expected: str, version: int) -> None:
    wrong = [f"group rank {r}: {c}" for r, c in enumerate(checksums) if c != expected]
    if wrong:
        raise RuntimeError(
            f"weight sync v{version} over the update group: actor checksum {expected}, but " + "; ".join(wrong)
            + " (an engine's parameter names, shapes or dtypes differ from the actor's?)"
        )
