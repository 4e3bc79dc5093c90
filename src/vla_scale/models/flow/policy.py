"""FlowPolicy: what every flow-matching VLA computes the same way, over a family's prefix and suffix passes.

A flow policy reads one sequence in two parts: a prefix (the cameras' patches, the prompt, and for some families the
state) that a vision-language model runs once per observation, and a suffix (the noisy action chunk and the flow
time) that an action expert runs at every denoising step, attending to the prefix's keys and values. How the two
are embedded and how their layers interleave is the family's (its folder of `models/`); this module holds the rest:

- the convention (openpi's, which LeRobot's policies keep): t = 1 is noise and t = 0 the data,
  x_t = t * noise + (1 - t) * actions, and the expert's output rows at the actions, projected to the action size,
  predict the velocity u = noise - actions; `flow_loss` is the per-element squared error against it, given the
  noise and the time so that a caller (or a test) fixes both;
- sampling: `sample_actions` takes K Euler steps of dt = -1/K from noise at t = 1 to t = 0, the prefix computed once;
  the step times are the family's (`flow_times`: openpi accumulates them in float32, LeRobot's shared loop rounds
  1 + k * dt from float64);
- the RL chains: the same steps as Gaussian transitions, Flow-SDE's (`objectives/flow_sde.py`, of a noise level) or,
  for a policy built with a noise head (`flow/noise_head.py`), Flow-Noise's (`objectives/flow_noise.py`: the Euler
  step plus noise whose std the head reads from the expert's output rows). `sample_chain` samples a chain and keeps
  every x_t and each step's log-prob; `chain_logprobs` recomputes those log-probs from a stored chain in one batched
  pass (the actor's update, with gradients). A step left deterministic (noise level 0, or not chosen) is
  `sample_actions`' step bit for bit, and `sample_actions` never reads the noise head.

What a family implements (the contract; `FlowPolicy`'s methods that raise NotImplementedError say each one's shapes):
`prefix_pass`, `suffix_rows`, `velocity_joint`, `compute_dtype`, `value_width`, and the attributes `spec` (with
`action_horizon`, `action_dim`, `num_steps`), `action_out_proj` and `noise_head` (None without Flow-Noise). The
prefix cache is one (keys, values) pair per layer, batch first, so that the update can pick its rows per step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vla_scale.models.critic import read_rows
from vla_scale.models.flow.noise_head import PREFIX as NOISE_HEAD_PREFIX
from vla_scale.models.flow.noise_head import NoiseHead
from vla_scale.models.lora import ServesMerged
from vla_scale.objectives.flow_noise import flow_noise_transition, step_entropy
from vla_scale.objectives.flow_sde import euler_times, gaussian_logprob, sde_transition

TIME_PERIODS = (4e-3, 4.0)
"""Shortest and longest period of the time embedding's sines (openpi's `min_period`, `max_period`)."""
MASKED = -2.3819763e38
"""What is added to the attention scores of a masked key (openpi's float32 near its lowest value: exp() gives 0)."""

PrefixCache = list[tuple[Tensor, Tensor]]
"""Per layer, the prefix's keys and values, batch first ([B, heads, P, head_dim] in both families)."""


@dataclass
class FlowInputs:
    """One batch of observations as a flow policy reads them (already normalised, tokenised and padded)."""

    images: Tensor  # float[B, N, 3, S, S] in [-1, 1], one slot per camera
    image_masks: Tensor  # bool[B, N]: False where the camera is missing (its patches are masked keys)
    tokens: Tensor  # int64[B, L]: the prompt (with the discretised state where a family writes it there), right-padded
    token_masks: Tensor  # bool[B, L]
    state: Tensor  # float[B, state size]: normalised, zero-padded (read where the family feeds it as a token)


@dataclass
class FlowChain:
    """One sampled denoising chain per example (`FlowPolicy.sample_chain`): what the actor needs to score it again."""

    actions: Tensor  # float32[B, H, action_dim]: the chain's end, the normalised actions
    chain: Tensor  # float32[B, K + 1, H, action_dim]: x at t = 1 (the noise), then after each of the K steps
    logprobs: Tensor  # float32[B, K]: each step's log-prob over the mask; 0 for a deterministic step
    stochastic: Tensor  # bool[B, K]: the steps that were Gaussian transitions (the others Euler steps)


def attention_allowed(pad: Tensor, blocks: Tensor) -> Tensor:
    """bool[B, Lq, Lk] from pad bool[B, L] and block starts [B, L] (1 where a new block begins): a query sees a key
    when both are real tokens and the key's block is not after the query's (big_vision's prefix-LM rule)."""
    block = torch.cumsum(blocks, dim=1)
    return (block[:, None, :] <= block[:, :, None]) & pad[:, None, :] & pad[:, :, None]


def additive(allowed: Tensor) -> Tensor:
    """bool[B, Lq, Lk] -> the float32 mask [B, 1, Lq, Lk] added to the attention scores."""
    return torch.where(allowed, 0.0, MASKED)[:, None]


def time_embedding(time: Tensor, width: int, periods: tuple[float, float] = TIME_PERIODS) -> Tensor:
    """Sine-cosine embedding [B, width] of flow times [B] (float64 inside, returned in the time's dtype)."""
    low, high = periods
    fraction = torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64, device=time.device)
    period = low * (high / low) ** fraction
    angle = (1.0 / period * 2 * math.pi)[None, :] * time[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).to(time.dtype)


def rounded_euler_times(num_steps: int, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """(times float32[K], dt float32 scalar) with the k-th time 1 + k * dt computed in float64 and rounded once
    (LeRobot's shared Euler loop), where `euler_times` accumulates float32 sums (openpi's); they part by a few ulps."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    dt = -1.0 / num_steps
    times = torch.tensor([1.0 + k * dt for k in range(num_steps)], dtype=torch.float32, device=device)
    return times, torch.tensor(dt, dtype=torch.float32, device=device)


def init_linear(module: nn.Module) -> None:
    """A fresh flow policy's init of a linear or embedding module: weights normal(0, 0.02), biases and an
    embedding's padding row 0 (other modules keep theirs)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
        if module.padding_idx is not None:
            nn.init.zeros_(module.weight[module.padding_idx])


def gathered(init: Callable[[nn.Module], None], kinds: tuple[type[nn.Module], ...]) -> Callable[[nn.Module], None]:
    """`init` of one module of `kinds` whose parameters are ZeRO-3 shards: gathered, set on rank 0, scattered back
    (`Module.apply` over a policy built inside `deepspeed.zero.Init`)."""

    def apply(module: nn.Module) -> None:
        if isinstance(module, kinds):
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0):
                init(module)

    return apply


def run_layer(layer: Callable[..., Any], index: int, recompute: int, training: bool, *args: Any) -> Any:
    """Layer `index` of a joint stack run on `args`; in training it keeps only its inputs and recomputes the rest in
    the backward pass when `recompute` says so (-1: every layer, else the first `recompute`)."""
    if training and torch.is_grad_enabled() and (recompute < 0 or index < recompute):
        return checkpoint(layer, *args, use_reentrant=False)
    return layer(*args)


class FlowPolicy(ServesMerged, nn.Module):
    """The flow-matching training loss, the Euler sampler and the RL chains over a family's passes (module
    docstring). With LoRA adapters (`models/lora.add_adapters`) it serves its weights merged (`served`)."""

    spec: Any
    action_out_proj: nn.Linear
    noise_head: NoiseHead | None

    flow_times = staticmethod(euler_times)
    """(times float32[K], dt) of K Euler steps from t = 1: the family's rounding of the schedule."""

    # ---- what a family implements -----------------------------------------------------------------------------------
    def load_checked_state_dict(self, tensors: dict[str, Tensor], what: str, tied: tuple[str, str] | None = None
                                ) -> None:
        """Copy `tensors` (our names) in, refusing by name anything missing, unexpected or of another shape. `tied`:
        a pair of names (LM head, token embedding) of which a saved state_dict may hold one standing for both; a
        noise head's tensors may be left out (it keeps its own). `what` names the state_dict in the error."""
        ours = self.state_dict()
        head = {k for k in ours if k.startswith(NOISE_HEAD_PREFIX)}
        whole = head <= set(tensors)
        if not whole:
            ours = {k: v for k, v in ours.items() if k not in head}
        if tied is not None and (tied[0] in tensors or tied[1] in tensors):
            tensors.setdefault(tied[0], tensors.get(tied[1])), tensors.setdefault(tied[1], tensors[tied[0]])
        missing, unexpected = sorted(set(ours) - set(tensors)), sorted(set(tensors) - set(ours))
        shapes = [f"{k} {tuple(tensors[k].shape)} (ours {tuple(ours[k].shape)})" for k in ours
                  if k in tensors and tensors[k].shape != ours[k].shape]
        problems = [f"{kind}: {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}"
                    for kind, keys in (("missing", missing), ("unexpected", unexpected), ("other shapes", shapes))
                    if keys]
        if problems:
            raise ValueError(f"not a {what} state_dict of this spec; " + "; ".join(problems))
        self.load_state_dict(tensors, strict=whole)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the layers compute in."""
        raise NotImplementedError

    @property
    def value_width(self) -> int:
        """The width of the prefix hidden state a value head reads (`prefix_pass`'s third output)."""
        raise NotImplementedError

    def prefix_pass(self, inputs: FlowInputs, skip_masked_slots: bool = False) -> tuple[PrefixCache, Tensor, Tensor]:
        """(the prefix's keys and values per layer, its pad mask bool[B, P], its hidden states [B, P, value_width]
        after the final norm). `skip_masked_slots`: a camera slot masked in every row may be left out (the
        sampling's pass; the update's keeps every slot)."""
        raise NotImplementedError

    def prefix_blocks(self) -> list[nn.Module]:
        """The modules of blocks the prefix pass runs (the vision tower's encoder layers, the VLM's decoder layers),
        whose linear layers the rollout engine may multiply in FP8 (`models/flow/fp8.py`)."""
        raise NotImplementedError

    def suffix_rows(self, state: Tensor, prefix_pad: Tensor, cache: PrefixCache, x_t: Tensor, time: Tensor) -> Tensor:
        """The expert's output rows at the actions [B, H, expert width] (after its final norm) at (x_t, time [B]),
        attending to the prefix's cache: what the velocity and the noise head read."""
        raise NotImplementedError

    def velocity_joint(self, inputs: FlowInputs, x_t: Tensor, time: Tensor) -> Tensor:
        """The predicted velocity float32[B, H, action_dim] at (x_t, time) from one pass over prefix and suffix."""
        raise NotImplementedError

    # ---- training ---------------------------------------------------------------------------------------------------
    def flow_loss(self, inputs: FlowInputs, actions: Tensor, noise: Tensor, time: Tensor) -> Tensor:
        """Per-element squared error float32[B, H, action_dim] between the predicted and the true velocity at
        x_t = t * noise + (1 - t) * actions (time [B] in (0, 1]; openpi and LeRobot draw it from
        0.001 + 0.999 * Beta(1.5, 1))."""
        t = time[:, None, None]
        x_t = t * noise + (1 - t) * actions
        return F.mse_loss(noise - actions, self.velocity_joint(inputs, x_t, time), reduction="none")

    def forward(self, inputs: FlowInputs, *args: Tensor, **kwargs: Any) -> Tensor | tuple[Tensor, Tensor]:
        """What the DeepSpeed engine runs: `flow_loss(inputs, actions, noise, time)` (SFT), or with `chain=`
        `chain_logprobs(inputs, chain=, noise_level=, stochastic=, mask=, with_entropy=)` (RL's update)."""
        if "chain" in kwargs:
            return self.chain_logprobs(inputs, **kwargs)
        return self.flow_loss(inputs, *args, **kwargs)

    # ---- sampling ---------------------------------------------------------------------------------------------------
    def prefix_cache(self, inputs: FlowInputs) -> tuple[PrefixCache, Tensor]:
        """Every layer's keys and values of the prefix, and its pad mask: what every denoising step attends to
        (camera slots masked in every row left out)."""
        cache, pad, _ = self.prefix_pass(inputs, skip_masked_slots=True)
        return cache, pad

    def denoise_step(self, state: Tensor, prefix_pad: Tensor, cache: PrefixCache, x_t: Tensor, time: Tensor
                     ) -> Tensor:
        """The velocity float32[B, H, action_dim] at (x_t, time [B]), the suffix attending to the prefix's cache."""
        return self.velocity(self.suffix_rows(state, prefix_pad, cache, x_t, time))

    def velocity(self, rows: Tensor) -> Tensor:
        """The velocity float32[B, H, action_dim] the expert's output rows at the actions [B, H, width] predict."""
        return self.action_out_proj(rows.to(self.compute_dtype)).float()

    def sample_noise(self, batch: int, device: torch.device | str | None = None,
                     generator: torch.Generator | None = None) -> Tensor:
        """Standard normal float32[batch, H, action_dim], the chain's start."""
        shape = (batch, self.spec.action_horizon, self.spec.action_dim)
        return torch.randn(shape, generator=generator, dtype=torch.float32, device=device)

    @torch.no_grad()
    def sample_actions(self, inputs: FlowInputs, noise: Tensor, num_steps: int | None = None) -> Tensor:
        """Normalised actions float32[B, H, action_dim]: K Euler steps (`num_steps`, default the spec's) from `noise`
        at t = 1 to t = 0 at the family's times (`flow_times`), the prefix computed once."""
        steps = num_steps or self.spec.num_steps
        cache, prefix_pad = self.prefix_cache(inputs)
        times, dt = self.flow_times(steps, noise.device)
        x_t = noise
        for k in range(steps):
            v_t = self.denoise_step(inputs.state, prefix_pad, cache, x_t, times[k].expand(noise.shape[0]))
            x_t = x_t + dt * v_t
        return x_t

    @torch.no_grad()
    def sample_chain(self, inputs: FlowInputs, noise: Tensor, noise_level: float | Tensor = 0.0,
                     generator: torch.Generator | None = None, step_noise: Tensor | None = None,
                     stochastic: Tensor | None = None, mask: Tensor | None = None,
                     num_steps: int | None = None) -> FlowChain:
        """K denoising steps from `noise` at t = 1, each a Flow-SDE transition of noise level a (a float or [B]),
        or with a noise head a Flow-Noise transition (its std from the head; `noise_level` unused), the prefix
        computed once. The steps' standard normal draws come from `step_noise` float32[B, K, H, D], else from
        `generator`, all drawn before the first step. `stochastic` bool[B, K] (default: all) picks the steps that
        are transitions; the others are the plain Euler step (Flow-SDE with a = 0; πRL's mixed ODE-SDE sampling
        makes one step per chain stochastic). `mask` (bool, broadcastable to [B, H, D]:
        `objectives.flow_sde.action_mask`) is where the log-probs count. With a = 0 everywhere (or no step chosen)
        the actions are `sample_actions`' bit for bit."""
        steps = num_steps or self.spec.num_steps
        batch = noise.shape[0]
        chosen = _steps_chosen(stochastic, batch, steps, noise.device)
        if step_noise is None:
            step_noise = torch.randn((batch, steps, *noise.shape[1:]), generator=generator, dtype=torch.float32,
                                     device=noise.device)
        cache, prefix_pad = self.prefix_cache(inputs)
        times, dt = self.flow_times(steps, noise.device)
        x_t, chain, logprobs = noise, [noise.float()], []
        for k in range(steps):
            rows = self.suffix_rows(inputs.state, prefix_pad, cache, x_t, times[k].expand(batch))
            v_t = self.velocity(rows)
            if self.noise_head is None:
                mean, std = sde_transition(x_t, v_t, times[k], dt, chosen[:, k].float() * noise_level)
            else:
                mean, std = flow_noise_transition(x_t, v_t, dt, self.noise_head(rows), chosen[:, k])
            x_t = mean + std * step_noise[:, k]
            logprobs.append(gaussian_logprob(x_t, mean, std, mask))
            chain.append(x_t.float())
        return FlowChain(actions=x_t, chain=torch.stack(chain, dim=1), logprobs=torch.stack(logprobs, dim=1),
                         stochastic=chosen)

    def chain_logprobs(self, inputs: FlowInputs, chain: Tensor, noise_level: float | Tensor = 0.0,
                       stochastic: Tensor | None = None, mask: Tensor | None = None, with_entropy: bool = False
                       ) -> Tensor | tuple[Tensor, Tensor]:
        """Each step's log-prob float32[B, K] of a stored chain float32[B, K + 1, H, D] (`FlowChain.chain`; K is
        read from it), as `sample_chain` computed them, with gradients into the policy (and its noise head). The
        prefix runs once; the stochastic steps of every example (`stochastic` bool[B, K], default all; the others
        are 0) run as one batch of suffix passes, each row attending to its example's cached prefix (the cache rows
        are gathered, a copy per step: the memory of K separate passes, in one). `with_entropy`: also each step's
        Gaussian entropy float32[B, K] over the mask (Flow-Noise's depends on the weights, so it comes from this
        pass)."""
        cache, prefix_pad, _ = self.prefix_pass(inputs)
        return self._steps_logprobs(inputs, cache, prefix_pad, chain, noise_level, stochastic, mask, with_entropy)

    def value_features(self, inputs: FlowInputs, *, position: str, chain: Tensor, noise_level: float | Tensor = 0.0,
                       stochastic: Tensor | None = None, mask: Tensor | None = None, with_entropy: bool = False
                       ) -> tuple[Tensor | tuple[Tensor, Tensor], Tensor]:
        """`chain_logprobs` and, from the same prefix pass, the hidden state [B, width] a value head reads
        (`models/critic.py`): the last valid prefix row's (`prompt_last`) or the mean over the valid prefix rows
        (`action_mean`: the rows every denoising step attends to)."""
        cache, pad, out = self.prefix_pass(inputs)
        steps = self._steps_logprobs(inputs, cache, pad, chain, noise_level, stochastic, mask, with_entropy)
        if position == "prompt_last":
            last = (pad.long() * torch.arange(pad.shape[1], device=pad.device)).argmax(dim=1)
            return steps, out[torch.arange(len(out), device=out.device), last]
        return steps, read_rows(out, position, valid=pad)

    def _steps_logprobs(self, inputs: FlowInputs, cache: PrefixCache, prefix_pad: Tensor, chain: Tensor,
                        noise_level: float | Tensor, stochastic: Tensor | None, mask: Tensor | None,
                        with_entropy: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """`chain_logprobs` on a prefix already run."""
        batch, steps = chain.shape[0], chain.shape[1] - 1
        rows, ks = _steps_chosen(stochastic, batch, steps, chain.device).nonzero(as_tuple=True)
        out = torch.zeros(batch, steps, dtype=torch.float32, device=chain.device)
        if rows.numel() == 0:
            return (out, out) if with_entropy else out
        cache = [(keys[rows], values[rows]) for keys, values in cache]
        times, dt = self.flow_times(steps, chain.device)
        x_t = chain[rows, ks]
        hidden = self.suffix_rows(inputs.state[rows], prefix_pad[rows], cache, x_t, times[ks])
        v_t = self.velocity(hidden)
        if self.noise_head is None:
            level = noise_level[rows] if isinstance(noise_level, Tensor) and noise_level.dim() else noise_level
            mean, std = sde_transition(x_t, v_t, times[ks], dt, level)
        else:
            mean, std = flow_noise_transition(x_t, v_t, dt, self.noise_head(hidden))
        if mask is not None and mask.dim() == 3:
            mask = mask.expand(batch, -1, -1)[rows]
        logprobs = out.index_put((rows, ks), gaussian_logprob(chain[rows, ks + 1], mean, std, mask))
        if not with_entropy:
            return logprobs
        return logprobs, out.index_put((rows, ks), step_entropy(std.expand_as(x_t), mask))


def _steps_chosen(stochastic: Tensor | None, batch: int, steps: int, device: torch.device) -> Tensor:
    """bool[B, K]: the given choice of stochastic steps (checked against the chain's shape), else every step."""
    if stochastic is None:
        return torch.ones(batch, steps, dtype=torch.bool, device=device)
    if stochastic.shape != (batch, steps):
        raise ValueError(f"stochastic must be bool[{batch}, {steps}], got {tuple(stochastic.shape)}")
    return stochastic.to(device=device, dtype=torch.bool)
