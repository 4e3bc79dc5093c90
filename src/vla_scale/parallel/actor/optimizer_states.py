"""The tensors a ZeRO optimizer keeps beside the working weights, moved between the GPU and pinned host memory:
all of them around a rollout (`OptimizerStates.offload` / `reload`) or one sub-group at a time through the optimizer
step (`stream_states_through_step`), so the update's forward and backward run without them on the GPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class OptimizerStates:
    """The tensors a ZeRO optimizer keeps beside the working weights: per sub-group, the fp32 master partition it
    steps and that partition's inner-optimizer state (Adam moments). `offload` moves them into (reused, pinned) host
    buffers, `reload` back to the device, either all of them or only some sub-groups'. `reload` moves whatever it
    finds off the device, so states that a checkpoint load put anywhere come back too."""

    def __init__(self, zero_optimizer: Any, device: torch.device):
        self.inner = zero_optimizer.optimizer  # the torch optimizer over the fp32 partitions
        # ZeRO-3 hands its fp32 partitions to the inner optimizer only for the duration of a step
        self.masters: list[torch.Tensor] = list(getattr(zero_optimizer, "fp32_partitioned_groups_flat", []))
        self.device = device
        self.host: dict[tuple[int, str], torch.Tensor] = {}

    def _tensors(self, groups: list[int] | None) -> list[tuple[tuple[int, str], Any, str]]:
        """(key, holder, name) of every tensor to move: each master partition (by its `.data`) and its state."""
        found: list[tuple[tuple[int, str], Any, str]] = []
        for i in range(len(self.masters)) if groups is None else groups:
            master = self.masters[i]
            found.append(((i, "data"), master, "data"))
            state = self.inner.state.get(master, {})
            found.extend(((i, key), state, key) for key, value in state.items() if torch.is_tensor(value))
        return found

    @staticmethod
    def _get(holder: Any, name: str) -> torch.Tensor:
        return holder.data if name == "data" else holder[name]

    @staticmethod
    def _set(holder: Any, name: str, value: torch.Tensor) -> None:
        if name == "data":
            holder.data = value
        else:
            holder[name] = value

    def offload(self, groups: list[int] | None = None, wait: bool = True) -> None:
        """Copy into the host buffers (scalars such as Adam's step count stay). Without `wait` the copies are only
        queued: the stream orders them before anything that reuses the freed device memory or reloads them."""
        pin = self.device.type == "cuda"
        for key, holder, name in self._tensors(groups):
            tensor = self._get(holder, name)
            host = self.host.get(key)
            if not tensor.dim() or host is tensor:
                continue
            if host is None or host.shape != tensor.shape or host.dtype != tensor.dtype:
                host = self.host[key] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
            host.copy_(tensor, non_blocking=pin)
            self._set(holder, name, host)
        if pin and wait:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def reload(self, groups: list[int] | None = None, wait: bool = True) -> None:
        for _, holder, name in self._tensors(groups):
            tensor = self._get(holder, name)
            if tensor.device != self.device:
                self._set(holder, name, tensor.to(self.device, non_blocking=True))
        if self.device.type == "cuda" and wait:
            torch.cuda.synchronize()


def stream_states_through_step(zero_optimizer: Any, states: OptimizerStates, active: Callable[[], bool]) -> None:
    """Make a ZeRO-3 optimizer's step fetch each sub-group's master partition and moments from the host just before
    it steps that sub-group, and send them back right after, while `active()`: the step then needs one sub-group's
    states on the GPU at a time. The copies are queued on the compute stream, in order, so no step reads a state
    before it arrives."""
    prepare, release = zero_optimizer._prepare_sub_group, zero_optimizer._release_sub_group

    def prepare_with_states(sub_group: int, timers: Any) -> None:
        if active():
            states.reload([sub_group], wait=False)
        prepare(sub_group, timers)

    def release_with_states(sub_group: int, timers: Any) -> None:
        release(sub_group, timers)
        if active():
            states.offload([sub_group], wait=False)

    zero_optimizer._prepare_sub_group = prepare_with_states
    zero_optimizer._release_sub_group = release_with_states
