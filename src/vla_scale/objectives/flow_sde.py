"""Flow-SDE: a flow policy's Euler denoising step made a Gaussian transition, so its sampled chain has a log-prob.

Convention (openpi's): x_t = t * noise + (1 - t) * actions, t = 1 is noise and t = 0 the data, the network predicts
the velocity v = noise - actions, and sampling takes K Euler steps of dt = -1/K from t = 1: x_{t+dt} = x_t + dt * v.
That chain is deterministic, so it has no likelihood to train with GRPO or PPO.

πRL (arXiv 2510.25889, after Flow-GRPO) replaces the ODE dx = v dt by the SDE with the same marginals p_t,

    dx = [v + sigma_t^2 / (2 t) * (x + (1 - t) v)] dt + sigma_t dW,     sigma_t = a * sqrt(t / (1 - t)),

where x + (1 - t) v is the model's estimate of the noise (so -(x + (1 - t) v) / t is its score of p_t) and `a` is
the noise level. One Euler-Maruyama step of it (dt < 0, |dt| = -dt) is the Gaussian transition

    x_{t+dt} ~ N(mean, std^2),  mean = x_t + dt * v + sigma_t^2 * dt / (2 t) * (x_t + (1 - t) v),
                                std = sigma_t * sqrt(|dt|),

independently per element given x_t. At t = 1 the ratio t / (1 - t) is infinite; 1 - t is floored at |dt| (πRL
divides by the next step's 1 - t, the same for uniform steps): the first step's std is then exactly `a`. With a = 0
the mean is the Euler step bit for bit (the correction adds a zero) and the std is 0: a deterministic step, whose
log-prob counts as 0 here (as in RLinf) rather than as a Dirac's.

A chain's log-prob is the sum of its steps' Gaussian log-probs, each summed over the elements the robot uses (the
model pads actions to its own dimension and a chunk may run only partly: `action_mask`). Every function is pure and
imports only torch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

LOG_2PI = math.log(2.0 * math.pi)


def euler_times(num_steps: int, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """(times float32[K], dt float32 scalar): the time at each of K Euler steps from t = 1, accumulated in float32
    (1, 1 + dt, 1 + dt + dt, ...) as openpi's loop (and `Pi0Policy.sample_actions`) does, so the chain is its chain
    step for step."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32, device=device)
    time = torch.tensor(1.0, dtype=torch.float32, device=device)
    times = []
    for _ in range(num_steps):
        times.append(time)
        time = time + dt
    return torch.stack(times), dt


def _rows(value: Tensor | float, like: Tensor) -> Tensor:
    """A per-row value ([...] over x's leading dims, or a scalar) shaped to broadcast over x [..., H, D]."""
    value = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    return value[..., None, None] if value.dim() else value


def sde_sigma(time: Tensor, dt: Tensor | float, noise_level: Tensor | float) -> Tensor:
    """sigma_t = a * sqrt(t / (1 - t)) with 1 - t floored at |dt| (the module docstring), per row: `time` [...],
    `noise_level` a scalar or [...]."""
    step = torch.as_tensor(dt, dtype=time.dtype, device=time.device).abs()
    remaining = torch.maximum(1.0 - time, step)
    return torch.as_tensor(noise_level, dtype=time.dtype, device=time.device) * torch.sqrt(time / remaining)


def sde_transition(x_t: Tensor, v_t: Tensor, time: Tensor, dt: Tensor | float, noise_level: Tensor | float
                   ) -> tuple[Tensor, Tensor]:
    """(mean, std) of x_{t+dt} given x_t [..., H, D], the velocity v_t there, the time [...] (or a scalar), the step
    dt < 0 and the noise level a (a scalar or [...]); std broadcasts to x's shape ([..., 1, 1]).

    The mean is written as the Euler step plus the SDE's correction, so that a = 0 gives `x_t + dt * v_t` exactly."""
    sigma = _rows(sde_sigma(torch.as_tensor(time, dtype=torch.float32, device=x_t.device), dt, noise_level), x_t)
    t = _rows(time, x_t)
    noise_estimate = x_t + (1.0 - t) * v_t
    euler = x_t + dt * v_t
    mean = euler + sigma.square() * dt / (2.0 * t) * noise_estimate
    std = sigma * torch.sqrt(torch.as_tensor(dt, dtype=x_t.dtype, device=x_t.device).abs())
    return mean, std


def gaussian_logprob(x: Tensor, mean: Tensor, std: Tensor, mask: Tensor | None = None) -> Tensor:
    """log N(x; mean, std^2) summed over the last two dims (a chunk's steps and action dims) where `mask` (bool,
    broadcastable to x) is True: float32[...]. Elements of std 0 (a deterministic step) count 0."""
    std = std.expand_as(x)
    deterministic = std == 0
    safe = torch.where(deterministic, torch.ones_like(std), std)
    z = (x - mean) / safe
    per_element = torch.where(deterministic, torch.zeros_like(z), -torch.log(safe) - 0.5 * LOG_2PI - 0.5 * z.square())
    if mask is not None:
        per_element = torch.where(mask, per_element, torch.zeros_like(per_element))
    return per_element.float().sum(dim=(-2, -1))


def chain_logprob(step_logprobs: Tensor) -> Tensor:
    """A chain's log-prob [B] from its steps' [B, K]: the transitions are a Markov chain, so their log-probs add
    (the start, standard normal noise, does not depend on the policy and is left out)."""
    return step_logprobs.sum(dim=-1)


def action_mask(horizon: int, model_dim: int, robot_dim: int, executed: Tensor | None = None) -> Tensor:
    """bool[H, D] (or [B, H, D] with `executed` int[B], the chunk steps each example ran): True on the robot's
    `robot_dim` first action dims (the rest is the model's zero padding) and, with `executed`, its first
    executed[b] chunk steps."""
    if not 1 <= robot_dim <= model_dim:
        raise ValueError(f"need 1 <= robot_dim <= model_dim, got {robot_dim} and {model_dim}")
    dims = torch.arange(model_dim) < robot_dim
    mask = dims[None, :].expand(horizon, -1)
    if executed is None:
        return mask
    steps = torch.arange(horizon, device=executed.device)[None, :] < executed[:, None]
    return steps[:, :, None] & mask.to(executed.device)[None]
