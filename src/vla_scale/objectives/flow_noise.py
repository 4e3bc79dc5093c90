"""Flow-Noise: a flow policy's Euler denoising step made a Gaussian transition whose std a learned network gives.

Convention as in `objectives/flow_sde.py` (openpi's: t = 1 is noise, K Euler steps of dt = -1/K). πRL (arXiv
2510.25889) offers two ways to give the chain a likelihood; Flow-SDE changes the step's mean to keep the ODE's
marginals, Flow-Noise keeps the mean and learns the noise. One step of Flow-Noise is

    x_{t+dt} ~ N(mean, std^2),   mean = x_t + dt * v_t  (the noise-free Euler step),   std = sigma_phi(features),

independently per element given x_t, with sigma_phi a small network (`models/pi0/noise_head.py`) that trains with the
policy gradient together with the policy. What comes from RLinf's implementation of πRL (rlinf/models/embodiment/
openpi/openpi_action_model.py, `noise_method == "flow_noise"`; rlinf/models/embodiment/modules/explore_noise_net.py):

- the mean: RLinf writes it as a blend of the model's data and noise estimates whose weights reduce to the Euler step;
- the std: the network reads the action expert's output rows at the actions (what the velocity projection reads),
  one std per chunk step and action dim, squashed by tanh into a log-variance between log(std_min^2) and
  log(std_max^2) (`bounded_std`); RLinf's default bounds (its `noise_logvar_range`, which holds stds) are
  [0.08, 0.16];
- every denoising step is stochastic and the chain's log-prob is over all of them (RLinf's `joint_logprob`, which its
  Flow-Noise configurations set); RLinf also counts the standard normal start, a constant of the weights, and
  averages the K + 1 terms, where we sum the K steps as `flow_sde.chain_logprob` does;
- the entropy is the Gaussians' (it depends on the learned std, so on the weights);
- evaluation is noise-free: RLinf's eval mode gives every step std 0, the plain ODE.

Every function is pure and imports only torch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vla_scale.objectives.policy_loss import gaussian_entropy


def bounded_std(raw: Tensor, std_min: float, std_max: float) -> Tensor:
    """float32 stds in [std_min, std_max] from the noise network's unbounded outputs: tanh maps each to [-1, 1], which
    maps linearly onto log-variances from log(std_min^2) to log(std_max^2) (so an output of 0 is the geometric mean
    of the bounds)."""
    if not 0.0 < std_min <= std_max:
        raise ValueError(f"need 0 < std_min <= std_max, got {std_min} and {std_max}")
    low, high = 2.0 * math.log(std_min), 2.0 * math.log(std_max)
    logvar = low + (high - low) * 0.5 * (torch.tanh(raw.float()) + 1.0)
    return torch.exp(0.5 * logvar)


def flow_noise_transition(x_t: Tensor, v_t: Tensor, dt: Tensor | float, std: Tensor,
                          stochastic: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(mean, std) of x_{t+dt} given x_t [..., H, D], the velocity v_t there, the step dt < 0 and the network's std
    [..., H, D]: the mean is the Euler step `x_t + dt * v_t` exactly; `stochastic` (bool [...]) zeroes the std of the
    rows it leaves deterministic, which then take the Euler step bit for bit."""
    mean = x_t + dt * v_t
    if stochastic is not None:
        std = torch.where(stochastic[..., None, None], std, torch.zeros_like(std))
    return mean, std


def step_entropy(std: Tensor, mask: Tensor | None = None) -> Tensor:
    """The entropy of one step's independent Gaussians of std `std` [..., H, D], summed over the last two dims where
    `mask` (bool, broadcastable) is True: float32[...]. Elements of std 0 (a deterministic step) count 0, as
    `flow_sde.gaussian_logprob` counts their log-prob."""
    deterministic = std == 0
    safe = torch.where(deterministic, torch.ones_like(std), std)
    per_element = torch.where(deterministic, torch.zeros_like(std), gaussian_entropy(torch.log(safe)))
    if mask is not None:
        per_element = torch.where(mask, per_element, torch.zeros_like(per_element))
    return per_element.float().sum(dim=(-2, -1))
