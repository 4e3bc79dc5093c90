"""PPO math with a critic, per action chunk: generalised advantage estimation, advantage normalisation, the clipped
value loss and the explained variance.

A chunk step is one decision: the policy sees an observation, emits a whole chunk, the env runs it and returns one
reward (the sum of its steps' rewards). An episode of T chunk steps gives rewards r_0..r_{T-1} and the critic's
values V_0..V_{T-1} of the observations the chunks were decoded on. After the last chunk:
- a terminated episode (the task succeeded: nothing follows) has V_T = 0;
- a truncated one (the step limit cut it) is bootstrapped with V_T = the critic's value of its final observation.
Every function is pure (no state, no I/O) and imports only torch, so the math can be checked by hand.
"""

from __future__ import annotations

import torch
from torch import Tensor


def chunk_gae(rewards: Tensor, values: Tensor, last_value: float, terminated: bool, gamma: float,
              lam: float) -> tuple[Tensor, Tensor]:
    """(advantages, returns) float64 [T] of one episode's chunk steps.

    delta_t = r_t + gamma * V_{t+1} - V_t with V_T = 0 when `terminated`, else `last_value`;
    A_t = delta_t + gamma * lam * A_{t+1} (A_T = 0); returns R_t = A_t + V_t, the value loss's targets.
    lam = 1 gives the discounted Monte-Carlo return minus V_t, lam = 0 the one-step TD error.
    """
    if rewards.dim() != 1 or values.shape != rewards.shape:
        raise ValueError(f"need rewards [T] and values [T], got {tuple(rewards.shape)} and {tuple(values.shape)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"need 0 <= gamma <= 1 and 0 <= lam <= 1, got gamma={gamma}, lam={lam}")
    r, v = rewards.detach().double(), values.detach().double()
    following = torch.cat([v[1:], v.new_tensor([0.0 if terminated else float(last_value)])])
    deltas = r + gamma * following - v
    advantages = torch.zeros_like(deltas)
    running = 0.0
    for t in range(len(deltas) - 1, -1, -1):
        running = float(deltas[t]) + gamma * lam * running
        advantages[t] = running
    return advantages, advantages + v


def normalized(values: Tensor, mean: float, std: float, eps: float = 1e-8) -> Tensor:
    """(values - mean) / (std + eps): advantages on one scale whatever the rewards' (mean and std over the whole
    step's chunk steps, every rank's: the caller reduces them)."""
    return (values - mean) / (std + eps)


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float, weights: Tensor
                       ) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped value loss, sum_i w_i * 0.5 * max((V_i - R_i)^2, (V_clip_i - R_i)^2), and its metrics.

    V_clip = V_old + clamp(V - V_old, -clip, clip) keeps one update from moving a value further than `clip` from the
    one the advantages were computed with; `clip` = 0 turns the clipping off (plain squared error). `weights` [M]
    spread the mini-batch's mean over its micro-batches (a row of weight 0, e.g. an episode's final observation,
    which has no target, adds nothing). Metrics: `value_clip_frac`, the share of weighted rows where the clipped
    branch is the larger one."""
    if not values.shape == old_values.shape == returns.shape == weights.shape or values.dim() != 1:
        raise ValueError(f"values, old_values, returns and weights must all be [M], got {tuple(values.shape)}, "
                         f"{tuple(old_values.shape)}, {tuple(returns.shape)}, {tuple(weights.shape)}")
    if clip < 0:
        raise ValueError(f"clip must be >= 0, got {clip}")
    v, old, target = values.float(), old_values.detach().float(), returns.detach().float()
    unclipped = (v - target).square()
    if clip > 0:
        clipped = (old + (v - old).clamp(-clip, clip) - target).square()
        taken = clipped > unclipped
        per_row = torch.maximum(unclipped, clipped)
    else:
        taken = torch.zeros_like(unclipped, dtype=torch.bool)
        per_row = unclipped
    w = weights.detach().float()
    loss = 0.5 * (per_row * w).sum()
    counted = w > 0
    frac = float(taken[counted].float().mean()) if bool(counted.any()) else 0.0
    return loss, {"value_clip_frac": frac}


def explained_variance(predicted: Tensor, targets: Tensor) -> float:
    """1 - Var[targets - predicted] / Var[targets]: 1 for a perfect critic, 0 for one that predicts the mean, < 0 for
    worse; 0 when the targets do not vary."""
    y, p = targets.detach().double(), predicted.detach().double()
    variance = float(y.var(correction=0)) if y.numel() else 0.0
    if variance == 0.0:
        return 0.0
    return 1.0 - float((y - p).var(correction=0)) / variance
