"""A flow-matching family's demonstrations -> what the flow-matching loss trains on (`models/interface.Demonstrations`).

Every env step t of every episode is one example:
- images: each of the policy's cameras resized to the tower's side by the family's resize (`FlowLayout.resize`), in
  its camera slot; slots the env has no camera for hold zeros and are masked;
- state: normalised with the demonstrations' statistics, zero-padded to the model's state size;
- prompt: the instruction through the family's tokenizer (π0.5's with the discretised state in it);
- actions: the chunk t .. t+H-1 of the policy's horizon H, normalised and zero-padded to the action size; past the
  episode's end the last action repeats and the step is marked padded (LeRobot's `action_is_pad`).
A step's draw holds the examples, the noise (standard normal) and the flow times (0.001 + 0.999 * Beta(1.5, 1), the
distribution openpi and LeRobot's flow policies train with), all from the trainer's seeded generator, so every rank
draws the same and a resume continues it; a family with an image augmentation (π0's openpi one) draws it there too. The
loss is the flow-matching squared error averaged over the real chunk steps and the robot's action dimensions only
(openpi averages over every step and all padded dimensions; the padding would only dilute the gradient).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from vla_scale.datasets.episodes import Episode
from vla_scale.models.flow.layout import FlowLayout, Normalizer, PromptTokenizer, pad_last, pixels_from_uint8
from vla_scale.models.flow.policy import FlowInputs
from vla_scale.models.interface import chunk_index, draw_batches

TIME_BETA = (1.5, 1.0)
"""openpi's flow-time distribution during training: Beta(1.5, 1), then squeezed into [0.001, 1]."""
TIME_FLOOR = 0.001



@dataclass(frozen=True)
class Augmentation:
    """A family's training augmentation of camera images: `draw(generator, slots, side)` once a step, then
    `apply(images float32[B, slots, 3, S, S], drawn)` on each micro-batch."""

    draw: Callable[[np.random.Generator, int, int], Any]
    apply: Callable[[Tensor, Any], Tensor]


@dataclass(frozen=True)
class FlowDraw:
    """One optimizer step's randomness: example indices [B], noise float32[B, H, D], flow times float32[B] and,
    with augmentation, the step's image augmentation draw (one for every example of the step, as openpi draws one
    per batch)."""

    index: np.ndarray
    noise: np.ndarray
    time: np.ndarray
    augment: Any = None


@dataclass(frozen=True)
class FlowBatch:
    """A flow family's micro-batch: the model's inputs, the normalised padded chunks, their noise and times, and which
    elements are real (float32 [B, H, D]: 1 on unpadded steps and the robot's action dimensions)."""

    inputs: FlowInputs
    actions: Tensor
    noise: Tensor
    time: Tensor
    valid: Tensor

    @property
    def examples(self) -> int:
        return len(self.time)

    def loss(self, forward: Callable[..., Any], policy: nn.Module, device: torch.device | str, trim: bool
             ) -> tuple[Tensor, dict[str, float]]:
        """The flow-matching loss over the valid elements; also openpi's own value (every element) and the share
        of valid elements. `trim` does not apply (the prompt budget is the model's)."""
        squared = forward(self.inputs, self.actions, self.noise, self.time)
        loss = (squared * self.valid).sum() / self.valid.sum().clamp(min=1.0)
        with torch.no_grad():
            measures = {"flow_mse_all": squared.mean().item(), "valid_share": self.valid.mean().item()}
        return loss, measures


@dataclass(frozen=True)
class FlowDemonstrations:
    """Every example of a dataset for a flow family's policy, prepared once (module docstring)."""

    images: np.ndarray  # uint8 [N, slots, S, S, 3]
    image_masks: np.ndarray  # bool [slots]
    tokens: np.ndarray  # int64 [N, L]
    token_masks: np.ndarray  # bool [N, L]
    state: np.ndarray  # float32 [N, D]
    actions: np.ndarray  # float32 [N, H, D]
    valid: np.ndarray  # float32 [N, H, D]
    augmentation: Augmentation | None = None  # each step's images augmented (π0: as openpi trains it)

    @classmethod
    def build(cls, episodes: Sequence[Episode], layout: FlowLayout, cameras: Sequence[str],
              normalizer: Normalizer, tokenizer: PromptTokenizer, augmentation: Augmentation | None = None
              ) -> FlowDemonstrations:
        parts = [_episode_arrays(e, layout, cameras, normalizer, tokenizer) for e in episodes]
        joined = [np.concatenate([p[i] for p in parts]) for i in range(6)]
        masks = np.arange(layout.num_images) < len(cameras)
        return cls(joined[0], masks, *joined[1:], augmentation=augmentation)

    def __len__(self) -> int:
        return len(self.state)

    def draw(self, generator: np.random.Generator, batch_size: int) -> FlowDraw:
        index = draw_batches(generator, len(self), batch_size)
        noise = generator.standard_normal((batch_size, *self.actions.shape[1:]))
        time = generator.beta(*TIME_BETA, size=batch_size) * (1 - TIME_FLOOR) + TIME_FLOOR
        augment = None if self.augmentation is None else self.augmentation.draw(generator, *self.images.shape[1:3])
        return FlowDraw(index, noise.astype(np.float32), time.astype(np.float32), augment)

    def batch(self, draw: FlowDraw, positions: np.ndarray, device: torch.device | str = "cpu") -> FlowBatch:
        i = draw.index[positions]
        batch = len(i)
        images = pixels_from_uint8(torch.from_numpy(self.images[i]).to(device))
        inputs = FlowInputs(
            images=images if draw.augment is None or self.augmentation is None else self.augmentation.apply(
                images, draw.augment),
            image_masks=torch.from_numpy(self.image_masks).to(device)[None].expand(batch, -1),
            tokens=torch.from_numpy(self.tokens[i]).to(device),
            token_masks=torch.from_numpy(self.token_masks[i]).to(device),
            state=torch.from_numpy(self.state[i]).to(device))
        return FlowBatch(inputs, torch.from_numpy(self.actions[i]).to(device),
                         torch.from_numpy(draw.noise[positions]).to(device),
                         torch.from_numpy(draw.time[positions]).to(device), torch.from_numpy(self.valid[i]).to(device))


def _episode_arrays(episode: Episode, spec: FlowLayout, cameras: Sequence[str], normalizer: Normalizer,
                    tokenizer: PromptTokenizer) -> tuple[np.ndarray, ...]:
    """One episode's (images, tokens, token masks, state, actions, valid) arrays, one row per step."""
    steps, side = len(episode), spec.image_size
    images = np.zeros((steps, spec.num_images, side, side, 3), dtype=np.uint8)
    for slot, camera in enumerate(cameras):
        images[:, slot] = [spec.resize(frame, side) for frame in episode.images[camera]]
    state = normalizer.normalize("state", episode.state.astype(np.float64))
    prompts = [tokenizer.tokenize(episode.instruction, s if spec.state_in_prompt else None) for s in state]
    index, pad = chunk_index(steps, spec.action_horizon)
    actions = normalizer.normalize("actions", episode.actions.astype(np.float64))[index]
    valid = np.zeros((steps, spec.action_horizon, spec.action_dim), dtype=np.float32)
    valid[:, :, : episode.actions.shape[1]] = (~pad)[:, :, None]
    return (images, np.stack([t for t, _ in prompts]), np.stack([m for _, m in prompts]),
            pad_last(state, spec.state_dim), pad_last(actions, spec.action_dim), valid)
