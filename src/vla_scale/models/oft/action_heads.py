"""The two ways an OFT policy turns its action rows into actions, and the distribution RL samples from each.

OpenVLA-OFT reads a whole chunk from the Llama backbone's last hidden states at its K = chunk_len * action_dim
action rows (`OFTPolicy.action_hidden_states`). Two heads read them:

- `tokens`: the LM head's logits over the `n_bins` action tokens; a categorical distribution per action dimension
  (what SimpleVLA-RL's and RLinf's checkpoints and token-head fine-tunes decode with).
- `l1`: OpenVLA-OFT's L1-regression head (what its official LIBERO fine-tunes were trained with): per chunk step,
  the hidden states of that step's `action_dim` rows are concatenated (action_dim * D values) and mapped by an MLP of
  two pre-norm residual blocks to the step's `action_dim` normalised actions. `L1RegressionHead` keeps the official
  module's parameter names (`model.fc1.weight`, `model.mlp_resnet_blocks.0.ffn.1.weight`, ...), so the official
  `action_head--<step>_checkpoint.pt` loads key for key. For RL the head's output is the mean of a Gaussian in the
  normalised action space with one learnable, state-independent log-std per action dimension (`ActionLogStd`,
  initialised to `model.action_log_std_init`); greedy decoding is the mean, as the official evaluation acts.

The policy's forward gives each head's distribution parameters per action dimension, [B, K, n_bins] bin logits or
[B, K, 2] (mean, log-std); `distribution(spec)` samples from them, scores samples and gives their entropy. A sample
is one value per action dimension either way (a bin index, or a normalised action value), so the log-probs,
the executed-action mask, the clipped ratio and its aggregation are the same code for both heads: the PPO ratio is
per action dimension (the token head's ratio is per token, one token per dimension; the Gaussian is diagonal, so a
chunk step's log-prob is the sum of its dimensions' and the per-dimension ratio clips each factor of it, like the
tokens').
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from torch import Tensor, nn

from vla_scale.models.oft.sampling import sample_bins
from vla_scale.models.oft.spec import ACTION_HEADS
from vla_scale.objectives import gaussian_entropy, gaussian_logprobs, logprobs_from_logits, token_entropy

HEADS = ACTION_HEADS
"""The action heads a policy can have (`model.action_head` also takes `auto`: the checkpoint folder's)."""

L1_BLOCKS = 2
"""Residual blocks of the official L1-regression head's MLP."""


class ResidualBlock(nn.Module):
    """x + ReLU(Linear(LayerNorm(x))): the pre-norm block of the official head (`ffn.0` norm, `ffn.1` linear)."""

    def __init__(self, dim: int):
        super().__init__()
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        return x + self.ffn(x)


class ResidualMLP(nn.Module):
    """LayerNorm -> Linear -> ReLU -> residual blocks -> LayerNorm -> Linear, official parameter names."""

    def __init__(self, blocks: int, in_dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.layer_norm1, self.fc1, self.relu = nn.LayerNorm(in_dim), nn.Linear(in_dim, hidden), nn.ReLU()
        self.mlp_resnet_blocks = nn.ModuleList(ResidualBlock(hidden) for _ in range(blocks))
        self.layer_norm2, self.fc2 = nn.LayerNorm(hidden), nn.Linear(hidden, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))


class L1RegressionHead(nn.Module):
    """Hidden states of the K action rows [B, K, D] -> normalised actions [B, K] (module docstring). It computes in
    its weights' dtype, the inputs cast to it: bf16 in a bf16 engine, as the official evaluation runs its head."""

    def __init__(self, hidden: int, chunk_len: int, action_dim: int):
        super().__init__()
        self.chunk_len, self.action_dim = chunk_len, action_dim
        self.model = ResidualMLP(L1_BLOCKS, action_dim * hidden, hidden, action_dim)

    def forward(self, hidden_states: Tensor) -> Tensor:
        batch = hidden_states.shape[0]
        steps = hidden_states.reshape(batch, self.chunk_len, -1).to(self.model.fc1.weight.dtype)
        return self.model(steps).reshape(batch, self.chunk_len * self.action_dim)


class ActionLogStd(nn.Module):
    """The Gaussian's log-std per action dimension (a module, so ZeRO-3 gathers it when it runs)."""

    def __init__(self, action_dim: int, init: float):
        super().__init__()
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init)))

    def forward(self, chunk_len: int) -> Tensor:
        return self.log_std.repeat(chunk_len)  # [K]: dimension j of every chunk step, OFT's step-major order


def l1_head_shapes(hidden: int, chunk_len: int, action_dim: int) -> dict[str, tuple[int, ...]]:
    """The parameter shapes of an L1 head for this policy size, by name (what a head file must hold)."""
    with torch.device("meta"):
        head = L1RegressionHead(hidden, chunk_len, action_dim)
    return {name: tuple(p.shape) for name, p in head.named_parameters()}


class ActionDistribution(Protocol):
    """Samples, log-probs and entropies of one head's distribution parameters, per action dimension."""

    def sample(self, params: Tensor, temperature: float, greedy: bool, generator: torch.Generator | None) -> Tensor:
        """One value per action dimension [B, K]: bin indices (int64) or normalised actions (float32)."""
        ...

    def logprobs(self, params: Tensor, samples: Tensor, temperature: float) -> Tensor:
        """float32 [B, K]: the log-prob (density) of each dimension's sample."""
        ...

    def entropy(self, params: Tensor, temperature: float) -> Tensor:
        """float32 [B, K]: each dimension's entropy (differential for the Gaussian)."""
        ...


class TokenBins:
    """Categorical over the action bins, at the sampling temperature."""

    def sample(self, params: Tensor, temperature: float, greedy: bool, generator: torch.Generator | None) -> Tensor:
        return sample_bins(params, temperature, greedy, generator)

    def logprobs(self, params: Tensor, samples: Tensor, temperature: float) -> Tensor:
        return logprobs_from_logits(params, samples, temperature)

    def entropy(self, params: Tensor, temperature: float) -> Tensor:
        return token_entropy(params, temperature)


class Gaussian:
    """Diagonal Gaussian around the L1 head's output. Its spread is the learned log-std alone: `algo.temperature`
    applies to the token head's logits and is not used here."""

    def sample(self, params: Tensor, temperature: float, greedy: bool, generator: torch.Generator | None) -> Tensor:
        mean = params[..., 0].float()
        if greedy:
            return mean
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=torch.float32)
        return mean + params[..., 1].float().exp() * noise

    def logprobs(self, params: Tensor, samples: Tensor, temperature: float) -> Tensor:
        return gaussian_logprobs(params[..., 0], params[..., 1], samples)

    def entropy(self, params: Tensor, temperature: float) -> Tensor:
        return gaussian_entropy(params[..., 1])


def distribution(head: str) -> ActionDistribution:
    """The sampling distribution of a policy whose action head is `head` (`HEADS`)."""
    if head not in HEADS:
        raise ValueError(f"action head {head!r}: choose one of {HEADS}")
    return Gaussian() if head == "l1" else TokenBins()


def executable(normalized: np.ndarray, greedy: bool) -> np.ndarray:
    """Sampled normalised actions clipped to [-1, 1], the range the dataset statistics un-normalise (the reach env's
    own action bounds); a greedy chunk (the head's mean) is left as it is, as the official evaluation sends it."""
    return normalized if greedy else np.clip(normalized, -1.0, 1.0)

