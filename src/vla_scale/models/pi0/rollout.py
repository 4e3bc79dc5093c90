"""π0 / π0.5 in the rollout engine: observations -> the model's inputs, prepared as SFT prepares them, and the chunk.

`Pi0Processor` (the source's `processor`, what the env loop calls) turns a batch of observations into `Pi0Inputs`
exactly as `models/pi0/demonstrations.py` turns a demonstration's steps into examples: each camera resized with
padding to the tower's side (`resize_with_pad`), in its slot (slots the env has no camera for hold zeros and are
masked), the state normalised with the policy's norm stats and zero-padded to the model's action size, the prompt
through the PaliGemma tokenizer (π0.5 with the discretised normalised state).

`Pi0Decoder` (the source's `chunk_decoder()`, what `RolloutEngine.decode` hands a batch to) decodes noise-free in
the sense openpi evaluates: `Pi0Policy.sample_actions`, the K-step Euler ODE from noise at t = 1, the noise drawn
from the engine's generator (seeded with the run's seed, so an evaluation plays the same episodes again); the
actions un-normalised with the policy's norm stats (as openpi's `Unnormalize`, full width then cut), cut to the
env's action size and to the first `actions_per_chunk` steps of the horizon (LeRobot's `n_action_steps`; the whole
horizon by default), which the env plays before the next decode.

There is no stochastic chain yet (Flow-SDE comes with RL), so `Decoded.tokens` holds the played normalised actions
(float32[B, chunk*action_dim], as the OFT l1 head's values) and `Decoded.logprobs` zeros of that shape: placeholders
that keep the records' shapes, read by nothing on the evaluation path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from vla_scale.envs.types import Observation
from vla_scale.models.pi0.demonstrations import pad_last, resize_with_pad
from vla_scale.models.pi0.normalize import Pi0Normalizer
from vla_scale.models.pi0.policy import Pi0Inputs, Pi0Policy, pixels_from_uint8
from vla_scale.models.pi0.spec import Pi0Spec
from vla_scale.models.pi0.tokenizer import PaliGemmaTokenizer


class Pi0Processor:
    """Observations -> `Pi0Inputs` as openpi's pipeline (and our SFT) prepares them (module docstring)."""

    def __init__(self, spec: Pi0Spec, cameras: Sequence[str], tokenizer: PaliGemmaTokenizer,
                 normalizer: Pi0Normalizer | None):
        self.spec, self.cameras, self.tokenizer, self.normalizer = spec, tuple(cameras), tokenizer, normalizer

    def prepare(self, observations: list[Observation], prepared: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The images as the tower sees them, uint8 [B, cameras, S, S, 3] (resized with padding), and the raw
        proprio [B, d]: what a rollout records. `prepared` does not apply (the simulators render, nothing more)."""
        missing = [c for c in self.cameras if observations and c not in observations[0].images]
        if missing:
            raise ValueError(f"the policy takes cameras {list(self.cameras)}; the observations have "
                             f"{sorted(observations[0].images)}")
        side = self.spec.vision.image_size
        images = np.stack([np.stack([resize_with_pad(o.images[c], side) for c in self.cameras])
                           for o in observations])
        return images, np.stack([o.proprio for o in observations])

    def normalized_state(self, proprio: np.ndarray) -> np.ndarray:
        """Raw proprio [B, d] -> float64 [B, d], normalised with the norm stats (as they are without any)."""
        state = np.asarray(proprio, dtype=np.float64)
        return state if self.normalizer is None else self.normalizer.normalize("state", state)

    def from_prepared(self, images: np.ndarray, instructions: list[str], proprio: np.ndarray,
                      device: torch.device | str = "cpu") -> Pi0Inputs:
        """Prepared images uint8 [B, cameras, S, S, 3] (`prepare`), the instructions and raw proprio [B, d] -> the
        model's inputs on `device`."""
        spec, batch = self.spec, len(images)
        slots = np.zeros((batch, spec.num_images, *images.shape[2:]), dtype=np.uint8)
        slots[:, : images.shape[1]] = images
        masks = np.broadcast_to(np.arange(spec.num_images) < images.shape[1], (batch, spec.num_images))
        state = self.normalized_state(proprio)
        prompts = [self.tokenizer.tokenize(text, s if spec.state_in_prompt else None)
                   for text, s in zip(instructions, state, strict=True)]
        return Pi0Inputs(images=pixels_from_uint8(torch.from_numpy(slots).to(device)),
                         image_masks=torch.from_numpy(np.ascontiguousarray(masks)).to(device),
                         tokens=torch.from_numpy(np.stack([t for t, _ in prompts])).to(device),
                         token_masks=torch.from_numpy(np.stack([m for _, m in prompts])).to(device),
                         state=torch.from_numpy(pad_last(state, spec.action_dim)).to(device))


class Pi0Decoder:
    """A batch of `Pi0Inputs` -> (tokens, logprobs, actions) of one chunk, noise-free (module docstring)."""

    def __init__(self, normalizer: Pi0Normalizer | None, env_action_dim: int, actions_per_chunk: int):
        self.normalizer, self.env_action_dim, self.actions_per_chunk = normalizer, env_action_dim, actions_per_chunk

    def normalized_actions(self, policy: nn.Module, batch: Pi0Inputs, generator: torch.Generator) -> torch.Tensor:
        """`Pi0Policy.sample_actions` from noise drawn with `generator`: float32 [B, H, action_dim], normalised."""
        assert isinstance(policy, Pi0Policy)
        noise = policy.sample_noise(len(batch.state), batch.state.device, generator)
        return policy.sample_actions(batch, noise)

    def env_chunk(self, normalized: np.ndarray) -> np.ndarray:
        """Normalised actions float32 [B, H, D] -> float64 [B, actions_per_chunk, env_action_dim]: un-normalised at
        full width (openpi's `Unnormalize`), then cut."""
        actions = normalized if self.normalizer is None else self.normalizer.unnormalize("actions", normalized)
        return np.asarray(actions[:, : self.actions_per_chunk, : self.env_action_dim], dtype=np.float64)

    @torch.no_grad()
    def decode(self, policy: nn.Module, batch: Pi0Inputs, temperature: float, greedy: bool,
               generator: torch.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens float32[B, chunk*env_action_dim]: the played normalised actions; logprobs: zeros of that shape;
        actions float64[B, chunk, env_action_dim]). Only the noise-free decode exists (`greedy`)."""
        del temperature  # the ODE has none
        if not greedy:
            raise NotImplementedError("π0 / π0.5 decode noise-free only (evaluation); the stochastic denoising "
                                      "chain RL samples (Flow-SDE) is not wired into the rollout engine yet")
        normalized = self.normalized_actions(policy, batch, generator).cpu().numpy()
        played = normalized[:, : self.actions_per_chunk, : self.env_action_dim]
        tokens = np.ascontiguousarray(played.reshape(len(played), -1), dtype=np.float32)
        return tokens, np.zeros_like(tokens), self.env_chunk(normalized)
