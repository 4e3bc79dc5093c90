"""RolloutEngine: its own copy of the policy weights, batched chunk decoding, SGLang-style weight-update hooks.

The engine never shares tensors with the actor: weights arrive through `update_weights_from_tensor` (copied), and
every output carries the policy version it was decoded with, so stale samples can be told apart.

The family's `ChunkDecoder` (`models/interface.py`: `PolicySource.chunk_decoder()`) turns a batch into a chunk with
the engine's policy and seeded generator: OFT's (`models/oft/decode.OFTDecoder`) samples the action head's
distribution over the engine's logits; π0's / π0.5's (`models/flow/rollout.FlowDecoder`) runs noise-free
`sample_actions` for evaluation and a Flow-SDE / Flow-Noise chain for RL (its record in `Decoded.sampled`, kept per
chunk by the env loop for the update). The engine computes logits two ways: the policy's own forward (`fast=False`,
the default on CPU, bitwise what the actor recomputes) and the fast forward the decoder builds where the family has
one (OFT's `FastForward`, `models/oft/fast_forward.py`: trimmed prompts, the decoder on packed real positions with
unmasked attention, compiled blocks, only the rows and bins that are read), the default on CUDA. The fast logits
equal the plain ones up to rounding (the kernels differ), so on the GPU the first PPO ratio of a step is 1 within
bf16 noise rather than exactly 1; sampling, log-probs and actions are the same code for both. `benchmarks/decode.py`
measures both and their agreement.

Weights arrive through `update_weights_from_tensor`: from the actor in the same process (`parallel/sync/weight_sync.py`)
or from trainer rank 0 over an update group, received by a `WeightReceiver` that wraps the engine
(`parallel/sync/update_group.py`; the engine knows no transport). When the
engine shares a GPU with the actor, `release_memory_occupation` frees its weights during the update and
`resume_memory_occupation` takes the memory back for the sync that follows.

`precision="fp8"` (`rollout.precision`): the family's products multiply in FP8: OFT's fast forward
(`models/oft/fp8.py`), the flow families' prefix pass (`models/flow/fp8.py`). The engine still
receives and holds the actor's weights exactly (the sync compares and fingerprints them); before the first forward
after a sync it quantises them into FP8 copies, so its log-probs are those of a slightly different policy, which the
trainer treats as the behaviour policy.

A decode and a sync never overlap: `decode` holds the engine's weight lock for the forward, and a sync holds it for
all of its buckets (`receiving`), so a decode running in another thread (`algo.max_staleness=1`) sees the weights of
one version, never half of the next.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from vla_scale.models.fp8 import PRECISIONS, fp8_problem
from vla_scale.models.interface import ChunkDecoder, Sampled
from vla_scale.tensors.checksum import weights_checksum
from vla_scale.tensors.spans import span


@dataclass
class Decoded:
    """One decoded batch: one sample per action dimension, their log-probs under the sampling distribution, and
    actions."""

    tokens: np.ndarray  # [B, chunk*action_dim]: int64 bins (token head) or float32 normalised values (l1 head;
    # π0: the played normalised actions, which nothing scores)
    logprobs: np.ndarray  # float32[B, chunk*action_dim] (π0: [B, 1], the chunk's Flow-SDE log-prob; 0 noise-free)
    actions: np.ndarray  # float64[B, chunk, action_dim]: un-normalised with the dataset statistics (if any)
    version: int
    sampled: Sampled = field(default_factory=dict)  # a family's record of what it sampled, per row (π0: the chain)


class RolloutEngine:
    """Decodes action chunks for batches of observations with its own copy of the weights."""

    def __init__(self, policy: nn.Module, device: str | torch.device = "cpu", seed: int = 0,
                 fast: bool | None = None, compile: bool | None = None, pin_memory: bool | None = None,
                 dtype: torch.dtype | None = None, precision: str = "bf16", emulate_fp8: bool = False,
                 filled: bool = True, *, decoder: ChunkDecoder):
        """`fast`, `compile`, `pin_memory`: None picks them by device (all on for CUDA, off on CPU). `compile`
        applies to the fast path only; `pin_memory` stages host inputs in reused page-locked buffers so that their
        copy to the GPU is asynchronous. `dtype`: cast the engine's weights (e.g. bfloat16), None keeps the policy's;
        weight sync then casts what it receives to it. `precision`: "bf16" multiplies in the weights' own dtype,
        "fp8" on FP8 tensor cores (fast path only; refused on a device without them); `emulate_fp8` runs the FP8
        arithmetic in float32 instead, on any device (tests). `filled=False`: the policy's weights hold no values yet
        (`PolicySource.unfilled_policy`); nothing is copied, and decoding waits for the first weight sync.
        `decoder`: the family's decode (`PolicySource.chunk_decoder()`; module docstring), which also builds the fast
        forward where the family has one."""
        self.device = torch.device(device)
        self.decoder = decoder
        on_gpu = self.device.type == "cuda"
        if precision not in PRECISIONS:
            raise ValueError(f"rollout.precision={precision!r}: choose one of {PRECISIONS}")
        problem = fp8_problem(self.device) if precision == "fp8" and not emulate_fp8 else None
        if problem is not None:
            raise ValueError(problem)
        self.policy = policy.eval().requires_grad_(False)
        self._lay_out_weights(dtype, copy=filled)
        if dtype is None:  # the buffers (the weights are in place already)
            self.policy.to(self.device)
        else:
            self.policy.to(self.device, dtype)
        self.version = -1
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        wants_fast = on_gpu or precision == "fp8"  # FP8 products exist on the fast path only
        self.fp8 = decoder.fp8_weights(emulate_fp8) if precision == "fp8" else None
        self._fp8_stale = True  # the FP8 copies no longer match the weights: quantise before the next forward
        use_fast = wants_fast if fast is None else fast
        compiled = on_gpu if compile is None else compile
        self.fast = decoder.fast_forward(self.policy, compiled, self.fp8) if use_fast else None
        fp8_fast = self.fp8 is not None and self.fp8.needs_fast_forward
        if self.fast is None and (fast or fp8_fast):
            why = "fast=False turns it off" if fast is False else "this policy has none (OFT's Llama policies with " \
                "a silu MLP have one)"
            what = "rollout.precision=fp8 and fast=True run" if fp8_fast else "fast=True runs"
            raise ValueError(f"{what} on the engine's fast path, and {why}: use "
                             f"{'rollout.precision=bf16' if fp8_fast else 'fast=None'}")
        self.pin_memory = on_gpu if pin_memory is None else pin_memory
        self._staging: dict[str, Tensor] = {}
        self.released = False
        self._awaiting_sync = not filled  # unfilled, or after resume_memory_occupation: until weights arrive
        self._shapes: list[torch.Size] = []
        self.weights = dict(self.policy.named_parameters())  # by name: looked up per bucket of every sync
        self._weights_lock = threading.Lock()  # one decode or one whole sync at a time

    def _lay_out_weights(self, dtype: torch.dtype | None, copy: bool, shapes: list[torch.Size] | None = None) -> None:
        """Place the weights on the engine's device end to end, in parameter order, one buffer per dtype (each
        parameter a view; its start rounded up to 16 bytes only where the one before ends unaligned, for compiled
        kernels). A weight-sync bucket then lands in one stretch of memory, which is compared and fingerprinted as it
        lies instead of being concatenated first. `copy`: move the current values (else the contents are undefined);
        `shapes`: the parameters' shapes when they hold no memory (released). Each parameter's old storage is let go
        as soon as its view takes over."""
        params = list(self.policy.parameters())
        layout: dict[torch.dtype, list[tuple[torch.nn.Parameter, int, torch.Size]]] = {}
        ends: dict[torch.dtype, int] = {}
        for p, shape in zip(params, shapes or [p.shape for p in params], strict=True):
            kind = dtype if dtype is not None and p.is_floating_point() else p.dtype
            align = max(1, 16 // kind.itemsize)
            start = ends.get(kind, 0)
            start += -start % align
            layout.setdefault(kind, []).append((p, start, shape))
            ends[kind] = start + shape.numel()
        for kind, members in layout.items():
            buffer = torch.empty(ends[kind], dtype=kind, device=self.device)
            for p, start, shape in members:
                view = buffer[start : start + shape.numel()].view(shape)
                if copy:
                    view.copy_(p.data)
                p.data = view

    def _to_device(self, name: str, tensor: Tensor) -> Tensor:
        """Host tensor -> device; through a reused page-locked buffer when `pin_memory` (the previous decode's copy
        from it has finished: every decode ends by reading its results back)."""
        if not (self.pin_memory and tensor.device.type == "cpu" and self.device.type == "cuda"):
            return tensor.to(self.device, non_blocking=True)
        buffer = self._staging.get(name)
        if buffer is None or buffer.dtype != tensor.dtype or buffer.numel() < tensor.numel():
            buffer = self._staging[name] = torch.empty(tensor.numel(), dtype=tensor.dtype).pin_memory()
        staged = buffer[: tensor.numel()].view(tensor.shape).copy_(tensor)
        return staged.to(self.device, non_blocking=True)

    def inputs(self, batch: Any) -> Any:
        """The batch (tensors by field: OFT's `PolicyInputs`) on the engine's device, staged through pinned host
        buffers where `pin_memory` (prompt padding trimmed first on the fast path)."""
        if self.fast is not None:
            batch = batch.trimmed()
        return type(batch)(*(self._to_device(name, t) for name, t in vars(batch).items()))

    def logits(self, batch: Any, prompt_lengths: list[int] | None = None) -> Tensor:
        """The policy's output (OFT: the action head's distribution parameters, bin logits float32[B,
        chunk*action_dim, n_bins] or the l1 head's [B, K, 2]) of a batch already on the device, from its own forward
        or the fast forward. `prompt_lengths` (the fast path's packing, read from the host's copy of the mask)
        spares reading them back from the device."""
        self.quantise()
        if self.fast is None:
            return self.policy(batch).float()
        return self.fast(batch.pixel_values, batch.input_ids, batch.attention_mask, batch.proprio, prompt_lengths)

    @torch.no_grad()
    def decode(self, batch: Any, temperature: float, greedy: bool = False) -> Decoded:
        """Sample (or take the mode of) every action dimension of the chunk in one forward pass, with the weights of
        one version (a sync waits for the decode to end, and the decode for a sync)."""
        with self._weights_lock:
            return self._decode(batch, temperature, greedy)

    @contextmanager
    def receiving(self) -> Iterator[None]:
        """Hold decodes off while a whole sync (every bucket, then its check) writes the weights."""
        with self._weights_lock:
            yield

    def _decode(self, batch: Any, temperature: float, greedy: bool) -> Decoded:
        if self.released or self._awaiting_sync:
            raise RuntimeError("the rollout engine holds no weights: sync them from the actor before decoding "
                               "(after resume_memory_occupation every weight must be pushed again)")
        self.quantise()
        tokens, logprobs, actions, sampled = self.decoder.decode(self, batch, temperature, greedy)
        return Decoded(tokens, logprobs, actions, self.version, sampled)

    @torch.no_grad()
    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Copy the given parameters into the engine's weights (a subset per call: buckets) and set the version."""
        params = self.weights
        targets, sources = [], []
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"weight sync sent {name!r}, which the rollout engine's policy does not have")
            target = params[name]
            if target.shape != tensor.shape:
                raise ValueError(f"weight sync shape mismatch for {name}: engine {target.shape} vs {tensor.shape}")
            targets.append(target.data)
            same = tensor.device == target.device and tensor.dtype == target.dtype
            sources.append(tensor if same else tensor.to(target.device, target.dtype))
        into, whole = span(targets), span(sources)
        if into is not None and whole is not None and into.numel() == whole.numel():
            into.copy_(whole)  # both sides end to end (the engine's layout, a gathered bucket): one copy
        else:
            torch._foreach_copy_(targets, sources)  # one call for the whole bucket, not one copy per tensor
        self.version = version
        self._awaiting_sync = False
        self._fp8_stale = True

    def quantise(self) -> None:
        """With fp8: make the FP8 copies of the weights as they are now, if a sync changed them since the last."""
        if self.fp8 is not None and self._fp8_stale:
            self.fp8.refresh(self.policy)
            self._fp8_stale = False

    # ---- sharing a GPU with the actor -------------------------------------------------------------------------------
    def release_memory_occupation(self) -> None:
        """Free the device memory of the weights while the actor trains; the next sync refills them."""
        if self.released:
            return
        self._shapes = [p.shape for p in self.policy.parameters()]
        for p in self.policy.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        if self.fp8 is not None:
            self.fp8.release()
            self._fp8_stale = True
        self.released = True
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def resume_memory_occupation(self) -> None:
        """Take the weights' memory back (contents undefined until the next weight sync, which must follow)."""
        if not self.released:
            return
        self._lay_out_weights(None, copy=False, shapes=self._shapes)
        self.released = False
        self._awaiting_sync = True

    def synchronize(self) -> None:
        """Wait until every copy queued into the weights has landed."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def checksum(self) -> str:
        return weights_checksum(self.policy.named_parameters())

