"""The tensors a ZeRO optimizer keeps beside the working weights, moved between the GPU and pinned host memory:
all of them around a rollout (`OptimizerStates.offload` / `reload`) or sub-group by sub-group through the optimizer
step (`StatesStream`), so the update's forward and backward run without them on the GPU."""

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

    def device_tensors(self, groups: list[int]) -> list[torch.Tensor]:
        """The tensors of `groups` now on the device."""
        found = [self._get(holder, name) for _, holder, name in self._tensors(groups)]
        return [t for t in found if t.device == self.device and t.dim()]

    def reload(self, groups: list[int] | None = None, wait: bool = True) -> None:
        for _, holder, name in self._tensors(groups):
            tensor = self._get(holder, name)
            if tensor.device != self.device:
                self._set(holder, name, tensor.to(self.device, non_blocking=True))
        if self.device.type == "cuda" and wait:
            torch.cuda.synchronize()


class StatesStream:
    """The optimizer step's sub-groups, their states fetched from the host and sent back around each one's step.

    On a GPU the copies run on two streams of their own, so both directions of the bus work at once and beside the
    step: while sub-group i steps, i + 1's states come in and i - 1's go out. A sub-group's fetch waits until the one
    two before it has left, so at most two sub-groups' states are on the device at a time (besides the resident ones).
    The last `resident` sub-groups' states stay on the device once there (a card with room for them). On the CPU the
    copies are plain synchronous ones in the same order. The values stepped are the same either way."""

    def __init__(self, states: OptimizerStates, resident: int = 0):
        self.states, self.resident = states, resident
        cuda = states.device.type == "cuda"
        self.fetch = torch.cuda.Stream(states.device) if cuda else None
        self.send = torch.cuda.Stream(states.device) if cuda else None
        self.fetched: dict[int, Any] = {}  # sub-group -> the event its fetch recorded
        self.sent: dict[int, Any] = {}  # sub-group -> the event its send recorded

    @property
    def count(self) -> int:
        return len(self.states.masters)

    def streamed(self, sub_group: int) -> bool:
        return 0 <= sub_group < self.count - self.resident

    def prepare(self, sub_group: int) -> None:
        """Before `sub_group` steps: its states on the device (fetched ahead, or now), the next one's fetch begun."""
        if sub_group == 0:
            self.wait()  # a step begins: the last step's copies out have reached the host buffers it reads
        if not self.streamed(sub_group):
            self.states.reload([sub_group], wait=False)  # a resident one: moves only the first time
            return
        event = self.fetched.pop(sub_group, None)
        if event is None:
            self._fetch(sub_group)
            event = self.fetched.pop(sub_group, None)
        if event is not None:
            torch.cuda.current_stream(self.states.device).wait_event(event)
        if self.streamed(sub_group + 1):
            self._fetch(sub_group + 1)

    def release(self, sub_group: int) -> None:
        """After `sub_group` stepped: its states sent back to the host buffers (queued behind the step)."""
        if not self.streamed(sub_group):
            return
        if self.send is None:
            self.states.offload([sub_group], wait=False)
            return
        compute = torch.cuda.current_stream(self.states.device)
        self.send.wait_stream(compute)
        with torch.cuda.stream(self.send):
            for tensor in self.states.device_tensors([sub_group]):
                tensor.record_stream(self.send)  # freed only once the copy has read it
            self.states.offload([sub_group], wait=False)
            self.sent[sub_group] = torch.cuda.Event()
            self.sent[sub_group].record(self.send)

    def _fetch(self, sub_group: int) -> None:
        """Queue `sub_group`'s states onto the device on the fetch stream, into memory allocated on the compute stream
        (the memory the sub-group two before it left, once its copy out is done)."""
        if self.fetch is None:
            self.states.reload([sub_group], wait=False)
            return
        before = self.sent.pop(sub_group - 2, None)
        if before is not None:
            before.synchronize()  # its memory free for this fetch: two sub-groups' states on the device at most
        moves = []
        for _, holder, name in self.states._tensors([sub_group]):
            host = self.states._get(holder, name)
            if host.device != self.states.device:  # scalars too: a checkpoint's load leaves Adam's step on the host
                moves.append((holder, name, host, torch.empty_like(host, device=self.states.device)))
        self.fetch.wait_stream(torch.cuda.current_stream(self.states.device))  # the memory's last use came before
        with torch.cuda.stream(self.fetch):
            for holder, name, host, device in moves:
                device.copy_(host, non_blocking=True)
                self.states._set(holder, name, device)
            self.fetched[sub_group] = torch.cuda.Event()
            self.fetched[sub_group].record(self.fetch)

    def wait(self) -> None:
        """Every queued copy done: the host buffers hold the states sent (end of an update)."""
        for stream in (self.fetch, self.send):
            if stream is not None:
                stream.synchronize()
        self.fetched.clear()
        self.sent.clear()


def stream_states_through_step(zero_optimizer: Any, stream: StatesStream, active: Callable[[], bool]) -> None:
    """Make a ZeRO-3 optimizer's step fetch each sub-group's master partition and moments from the host just before
    it steps that sub-group, and send them back right after, while `active()` (`StatesStream`): the step then needs
    two sub-groups' states on the GPU at a time."""
    prepare, release = zero_optimizer._prepare_sub_group, zero_optimizer._release_sub_group

    def prepare_with_states(sub_group: int, timers: Any) -> None:
        if active():
            stream.prepare(sub_group)
        prepare(sub_group, timers)

    def release_with_states(sub_group: int, timers: Any) -> None:
        release(sub_group, timers)
        if active():
            stream.release(sub_group)

    zero_optimizer._prepare_sub_group = prepare_with_states
    zero_optimizer._release_sub_group = release_with_states
