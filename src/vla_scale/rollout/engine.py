"""RolloutEngine: its own copy of the policy weights, batched chunk decoding, SGLang-style weight-update hooks.

The engine never shares tensors with the actor: weights arrive through `update_weights_from_tensor` (copied), and
every output carries the policy version it was decoded with, so stale samples can be told apart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vla_scale.models.policy import OFTPolicy, PolicyInputs


@dataclass
class Decoded:
    """One decoded batch: action-bin tokens, their log-probs under the sampling temperature, and actions."""

    tokens: np.ndarray  # int64[B, chunk*action_dim]
    logprobs: np.ndarray  # float32[B, chunk*action_dim]
    actions: np.ndarray  # float32[B, chunk, action_dim], normalised to [-1, 1]
    version: int


def weights_checksum(named_tensors: Iterable[tuple[str, Tensor]]) -> str:
    """Hash of names, shapes, dtypes and exact bytes, in name order: equal iff the weights are identical."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        t = tensor.detach().contiguous().cpu()
        digest.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


class RolloutEngine:
    """Decodes action chunks for batches of observations with its own copy of the weights."""

    def __init__(self, policy: OFTPolicy, device: str | torch.device = "cpu", seed: int = 0):
        self.policy = policy.to(device).eval().requires_grad_(False)
        self.device = torch.device(device)
        self.version = -1
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    @torch.no_grad()
    def decode(self, batch: PolicyInputs, temperature: float, greedy: bool = False) -> Decoded:
        """Sample (or take the argmax of) every action token of the chunk in one forward pass."""
        logits = self.policy(batch.to(self.device)).float() / temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        if greedy:
            tokens = logits.argmax(dim=-1)
        else:
            flat = logp_all.exp().reshape(-1, logits.shape[-1])
            tokens = torch.multinomial(flat, 1, generator=self.generator).view(logits.shape[:-1])
        logprobs = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        tokens_np = tokens.cpu().numpy()
        return Decoded(tokens_np, logprobs.cpu().numpy(), self.policy.tokens_to_actions(tokens_np), self.version)

    @torch.no_grad()
    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Copy the given parameters into the engine's weights (a subset per call: buckets) and set the version."""
        params = dict(self.policy.named_parameters())
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"weight sync sent {name!r}, which the rollout engine's policy does not have")
            target = params[name]
            if target.shape != tensor.shape:
                raise ValueError(f"weight sync shape mismatch for {name}: engine {target.shape} vs {tensor.shape}")
            target.copy_(tensor.to(target.device, target.dtype))
        self.version = version

    def checksum(self) -> str:
        return weights_checksum(self.policy.named_parameters())

    def set_seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)
