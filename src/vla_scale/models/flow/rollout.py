"""A flow-matching family in the rollout engine: observations -> the model's inputs, prepared as SFT prepares them,
and the chunk (π0 / π0.5: `models/pi0/`; each family builds these with its own `FlowLayout`, tokenizer and
normaliser).

`FlowProcessor` (the source's `processor`, what the env loop calls) turns a batch of observations into `FlowInputs`
exactly as `models/flow/demonstrations.py` turns a demonstration's steps into examples: each camera resized to the
tower's side by the family's resize, in its slot (slots the env has no camera for hold zeros and are masked), the
state normalised with the policy's statistics and zero-padded to the model's state size, the prompt through the
family's tokenizer (π0.5's with the discretised normalised state).

`FlowDecoder` (the source's `chunk_decoder()`, what `RolloutEngine.decode` hands a batch to) decodes noise-free in
the sense openpi and LeRobot evaluate: `FlowPolicy.sample_actions`, the K-step Euler ODE from noise at t = 1, the
noise drawn from the engine's generator (seeded with the run's seed, so an evaluation plays the same episodes again);
the actions un-normalised with the policy's statistics (full width, then cut), cut to the env's action size and to
the first `actions_per_chunk` steps of the horizon (LeRobot's `n_action_steps`; the whole horizon by default), which
the env plays before the next decode.

For RL (`greedy=False`, launch/train.py's rollout) it samples a Flow-SDE chain instead (`FlowPolicy.sample_chain`,
πRL's mixed ODE-SDE sampling): from the same noise, one of the K denoising steps per chunk, drawn uniformly with the
engine's generator, is a Gaussian transition of the noise level `noise_level`, the others plain Euler steps
(`stochastic_steps=all`: every step a transition). Its log-prob is one number per chunk (RLinf's chunk_level): the
stochastic steps' Gaussian log-probs summed over the chunk's played steps (`actions_per_chunk`) and the robot's
action dims (`chunk_mask`); all of them count, even where the episode ended inside the chunk, as the chunk is the
action taken. `Decoded.sampled` keeps what the update needs to compute it again (`FlowScorer`): the chain
float32[B, K + 1, H, D], which steps were stochastic bool[B, K] and the noise level float32[B]. The sampling
temperature does not apply (the noise level plays its part).

With `rl_noise=flow_noise` the chain is πRL's Flow-Noise instead (`objectives/flow_noise.py`): every step is
stochastic by default (`stochastic_steps` '' resolves to all; RLinf's `joint_logprob`), each the Euler step plus
Gaussian noise whose std the policy's noise head reads from the expert's output rows; the record is the chain and the
stochastic steps (no noise level: the std is the weights', recomputed by the scorer with gradients into the head).
The logged entropy is then the learned stds' Gaussian entropy, from the scorer's own pass.

`Decoded.tokens` holds the played normalised actions (float32[B, chunk*action_dim], as the OFT l1 head's values),
which nothing scores; noise-free, `Decoded.logprobs` is zeros [B, 1].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vla_scale.envs.types import Observation
from vla_scale.models.flow.fp8 import PrefixFp8
from vla_scale.models.flow.layout import FlowLayout, Normalizer, PromptTokenizer, pad_last, pixels_from_uint8
from vla_scale.models.flow.policy import FlowChain, FlowInputs, FlowPolicy
from vla_scale.models.flow.settings import RL_NOISES, resolved_stochastic_steps
from vla_scale.models.interface import DecodingEngine
from vla_scale.objectives.flow_sde import action_mask, euler_times, sde_sigma


@dataclass(frozen=True)
class FlowPrepared:
    """A batch of `FlowInputs` on the host, images still uint8 (what the update's micro-batches keep): `on(device)`
    makes the model's inputs."""

    images: np.ndarray  # uint8 [B, slots, S, S, 3]
    image_masks: np.ndarray  # bool [B, slots]
    tokens: np.ndarray  # int64 [B, L]
    token_masks: np.ndarray  # bool [B, L]
    state: np.ndarray  # float [B, action_dim]

    def __len__(self) -> int:
        return len(self.images)

    def rows(self, keep: np.ndarray) -> FlowPrepared:
        return FlowPrepared(*(np.ascontiguousarray(a[keep]) for a in vars(self).values()))

    def on(self, device: torch.device | str) -> FlowInputs:
        return FlowInputs(images=pixels_from_uint8(torch.from_numpy(self.images).to(device)),
                         image_masks=torch.from_numpy(self.image_masks).to(device),
                         tokens=torch.from_numpy(self.tokens).to(device),
                         token_masks=torch.from_numpy(self.token_masks).to(device),
                         state=torch.from_numpy(self.state).to(device))


class FlowProcessor:
    """Observations -> `FlowInputs` as the family's SFT prepares them (module docstring)."""

    def __init__(self, layout: FlowLayout, cameras: Sequence[str], tokenizer: PromptTokenizer,
                 normalizer: Normalizer | None):
        self.layout, self.cameras, self.tokenizer, self.normalizer = layout, tuple(cameras), tokenizer, normalizer

    def prepare(self, observations: list[Observation], prepared: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The images as the tower sees them, uint8 [B, cameras, S, S, 3] (resized with padding), and the raw
        proprio [B, d]: what a rollout records. `prepared` does not apply (the simulators render, nothing more)."""
        missing = [c for c in self.cameras if observations and c not in observations[0].images]
        if missing:
            raise ValueError(f"the policy takes cameras {list(self.cameras)}; the observations have "
                             f"{sorted(observations[0].images)}")
        side = self.layout.image_size
        images = np.stack([np.stack([self.layout.resize(o.images[c], side) for c in self.cameras])
                           for o in observations])
        return images, np.stack([o.proprio for o in observations])

    def normalized_state(self, proprio: np.ndarray) -> np.ndarray:
        """Raw proprio [B, d] -> float64 [B, d], normalised with the norm stats (as they are without any)."""
        state = np.asarray(proprio, dtype=np.float64)
        return state if self.normalizer is None else self.normalizer.normalize("state", state)

    def from_prepared(self, images: np.ndarray, instructions: list[str], proprio: np.ndarray,
                      device: torch.device | str = "cpu") -> FlowInputs:
        """Prepared images uint8 [B, cameras, S, S, 3] (`prepare`), the instructions and raw proprio [B, d] -> the
        model's inputs on `device`."""
        return self.encode(images, instructions, proprio).on(device)

    def encode(self, images: np.ndarray, instructions: list[str], proprio: np.ndarray) -> FlowPrepared:
        """`from_prepared`'s inputs kept on the host, images uint8 in their camera slots (the update's)."""
        layout, batch = self.layout, len(images)
        slots = np.zeros((batch, layout.num_images, *images.shape[2:]), dtype=np.uint8)
        slots[:, : images.shape[1]] = images
        masks = np.tile(np.arange(layout.num_images) < images.shape[1], (batch, 1))  # its own writable rows
        state = self.normalized_state(proprio)
        prompts = [self.tokenizer.tokenize(text, s if layout.state_in_prompt else None)
                   for text, s in zip(instructions, state, strict=True)]
        return FlowPrepared(slots, masks, np.stack([t for t, _ in prompts]),
                            np.stack([m for _, m in prompts]), pad_last(state, layout.state_dim))


def chunk_mask(shape: Any, env_action_dim: int, actions_per_chunk: int) -> Tensor:
    """bool[H, D]: where a chunk's log-prob counts, the played steps of the horizon and the robot's action dims
    (`shape`: a `FlowLayout` or a policy's spec, with `action_horizon` and `action_dim`)."""
    played = torch.arange(shape.action_horizon) < actions_per_chunk
    return action_mask(shape.action_horizon, shape.action_dim, env_action_dim) & played[:, None]


def one_stochastic_step(step: Tensor, num_steps: int) -> Tensor:
    """bool[B, K]: True at each row's stochastic step `step` int64[B]."""
    return F.one_hot(step, num_steps).bool()


class FlowDecoder:
    """A batch of `FlowInputs` -> (tokens, logprobs, actions, sampled) of one chunk: noise-free, or a Flow-SDE or
    Flow-Noise chain (module docstring)."""

    def __init__(self, normalizer: Normalizer | None, env_action_dim: int, actions_per_chunk: int,
                 noise_level: float = 0.5, stochastic_steps: str = "", rl_noise: str = "flow_sde"):
        self.normalizer, self.env_action_dim, self.actions_per_chunk = normalizer, env_action_dim, actions_per_chunk
        self.noise_level, self.rl_noise = noise_level, rl_noise
        self.stochastic_steps = resolved_stochastic_steps(stochastic_steps, rl_noise)

    def normalized_actions(self, policy: nn.Module, batch: FlowInputs, generator: torch.Generator) -> torch.Tensor:
        """`FlowPolicy.sample_actions` from noise drawn with `generator`: float32 [B, H, action_dim], normalised."""
        assert isinstance(policy, FlowPolicy)
        noise = policy.sample_noise(len(batch.state), batch.state.device, generator)
        return policy.sample_actions(batch, noise)

    def env_chunk(self, normalized: np.ndarray) -> np.ndarray:
        """Normalised actions float32 [B, H, D] -> float64 [B, actions_per_chunk, env_action_dim]: un-normalised at
        full width (openpi's `Unnormalize`), then cut."""
        actions = normalized if self.normalizer is None else self.normalizer.unnormalize("actions", normalized)
        return np.asarray(actions[:, : self.actions_per_chunk, : self.env_action_dim], dtype=np.float64)

    def sample_chain(self, policy: FlowPolicy, batch: FlowInputs, generator: torch.Generator) -> FlowChain:
        """A Flow-SDE or Flow-Noise chain per row (the policy has a noise head exactly for Flow-Noise), drawn with
        `generator` (the noise, then the stochastic step of each row, then the steps' draws): one stochastic step,
        or all of them (`stochastic_steps`)."""
        if (policy.noise_head is not None) != (self.rl_noise == "flow_noise"):
            has = "has" if policy.noise_head is not None else "lacks"
            raise ValueError(f"rl_noise={self.rl_noise} but the policy {has} a noise head: build it with the source "
                             "the decoder came from (its rl_noise)")
        rows, device, steps = len(batch.state), batch.state.device, policy.spec.num_steps
        noise = policy.sample_noise(rows, device, generator)
        if self.stochastic_steps == "all":
            stochastic = torch.ones(rows, steps, dtype=torch.bool, device=device)
        else:
            stochastic = one_stochastic_step(torch.randint(steps, (rows,), generator=generator, device=device), steps)
        mask = chunk_mask(policy.spec, self.env_action_dim, self.actions_per_chunk).to(device)
        return policy.sample_chain(batch, noise, self.noise_level, generator=generator, stochastic=stochastic,
                                   mask=mask)

    @staticmethod
    def fp8_weights(emulate: bool) -> PrefixFp8:
        """The FP8 copies of the prefix's matrices (`models/flow/fp8.py`), which the policy's own passes use."""
        return PrefixFp8(emulate)

    @staticmethod
    def fast_forward(policy: nn.Module, compile: bool, fp8: Any) -> None:
        """None: a flow policy decodes with its own `sample_actions` / `sample_chain` (no fast forward)."""
        return None

    @torch.no_grad()
    def decode(self, engine: DecodingEngine, batch: FlowInputs, temperature: float, greedy: bool
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """(tokens float32[B, chunk*env_action_dim]: the played normalised actions; logprobs float32[B, 1]: the
        chunk's; actions float64[B, chunk, env_action_dim]; sampled: the chain's record, empty noise-free) of the
        engine's policy. `greedy`: noise-free (evaluation), else a Flow-SDE or Flow-Noise chain (RL)."""
        del temperature  # the noise level plays its part
        policy, generator = engine.policy, engine.generator
        assert isinstance(policy, FlowPolicy)
        if greedy:
            normalized_t, logprobs, sampled = self.normalized_actions(policy, batch, generator), None, {}
        else:
            chain = self.sample_chain(policy, batch, generator)
            normalized_t, logprobs = chain.actions, chain.logprobs.sum(dim=1, keepdim=True)
            sampled = {"chain": chain.chain.cpu().numpy(), "stochastic": chain.stochastic.cpu().numpy()}
            if self.rl_noise == "flow_sde":
                sampled["noise_level"] = np.full(len(chain.actions), self.noise_level, dtype=np.float32)
        normalized = normalized_t.cpu().numpy()
        played = normalized[:, : self.actions_per_chunk, : self.env_action_dim]
        tokens = np.ascontiguousarray(played.reshape(len(played), -1), dtype=np.float32)
        logprobs_np = np.zeros((len(tokens), 1), np.float32) if logprobs is None else logprobs.float().cpu().numpy()
        return tokens, logprobs_np, self.env_chunk(normalized), sampled


class FlowScorer:
    """The actor's side of the chain (`ChunkScorer`): a recorded chunk's log-prob again, with gradients, as the
    rollout computed it (`FlowPolicy.chain_logprobs` on the stochastic steps, summed over `chunk_mask`), and the
    entropy of those steps' Gaussians over the same elements (Flow-SDE's in closed form, Flow-Noise's from the
    learned stds of the same pass)."""

    def __init__(self, layout: FlowLayout, env_action_dim: int, actions_per_chunk: int, rl_noise: str = "flow_sde"):
        if rl_noise not in RL_NOISES:
            raise ValueError(f"rl_noise={rl_noise!r}: choose one of {RL_NOISES}")
        self.layout, self.mask = layout, chunk_mask(layout, env_action_dim, actions_per_chunk)
        self.rl_noise = rl_noise

    def logprobs(self, forward: Callable[..., Any], policy: nn.Module, inputs: FlowPrepared, tokens: Tensor,
                 sampled: dict[str, Tensor], device: torch.device, temperature: float, trim: bool, **critic: bool
                 ) -> tuple[Tensor, Callable[[], Tensor], Tensor | None]:
        """(log-probs float32[B, 1], how to read the entropy float32[B, 1], the values float32[B] or None) of the
        recorded chains (the tokens, the played actions, are not what is scored; the noise level stands for the
        temperature; the prefix is never trimmed). `critic` (`detach_backbone=`) is given when `forward` is a policy
        with a value head, whose values come from the same prefix pass."""
        del policy, tokens, temperature, trim
        if "chain" not in sampled:
            raise ValueError("the rollout recorded no denoising chain to score (Decoded.sampled was empty: a "
                             "noise-free decode)")
        chain, stochastic = sampled["chain"].to(device), sampled["stochastic"].to(device).bool()
        mask = self.mask.to(device)
        if self.rl_noise == "flow_noise":
            out = forward(inputs.on(device), chain=chain, stochastic=stochastic, mask=mask, with_entropy=True,
                          **critic)
            (steps, entropies), values = out if critic else (out, None)
            return steps.sum(dim=1, keepdim=True), entropies.sum(dim=1, keepdim=True).detach, values
        level = sampled["noise_level"].to(device)
        out = forward(inputs.on(device), chain=chain, noise_level=level, stochastic=stochastic, mask=mask, **critic)
        steps, values = out if critic else (out, None)
        return steps.sum(dim=1, keepdim=True), self.entropy(stochastic, level, mask).detach, values

    @staticmethod
    def entropy(stochastic: Tensor, level: Tensor, mask: Tensor) -> Tensor:
        """The stochastic steps' Gaussian entropies float32[B, 1], summed over the steps and the mask's elements
        (they depend on the steps' times and the noise level, not on the weights)."""
        times, dt = euler_times(stochastic.shape[1], stochastic.device)
        std = sde_sigma(times[None, :], dt, level[:, None]) * dt.abs().sqrt()  # [B, K]
        per_element = torch.where(stochastic, 0.5 * (1.0 + math.log(2.0 * math.pi)) + torch.log(std), 0.0)
        return (per_element.sum(dim=1) * mask.sum()).float()[:, None]
