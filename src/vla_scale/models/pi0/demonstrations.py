"""π0 / π0.5's demonstrations -> what the flow-matching loss trains on, prepared as openpi's data pipeline does.

Every env step t of every episode is one example (`models/interface.Demonstrations`):

- images: each of the policy's cameras resized to the tower's side with padding (the aspect ratio kept, the rest
  black; PIL's bilinear filter on uint8, openpi's `resize_with_pad`), in its camera slot; slots the env has no
  camera for hold zeros and are masked;
- state: normalised with the demonstrations' statistics (z-score for π0, quantiles for π0.5), zero-padded to the
  model's action size;
- prompt: the instruction through the PaliGemma tokenizer (π0.5 with the discretised state in it);
- actions: the chunk t .. t+H-1 of the policy's horizon H, normalised and zero-padded to the action size; past the
  episode's end the last action repeats and the step is marked padded (LeRobot's `action_is_pad`).

A step's draw holds the examples, the noise (standard normal) and the flow times (openpi's 0.001 + 0.999 * Beta(1.5,
1)), all from the trainer's seeded generator, so every rank draws the same and a resume continues it. The loss is
the flow-matching squared error averaged over the real chunk steps and the robot's action dimensions only (openpi
averages over every step and all 32 padded dimensions; the padding would only dilute the gradient).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

from vla_scale.datasets.episodes import Episode
from vla_scale.models.interface import chunk_index, draw_batches
from vla_scale.models.pi0.augment import AugmentDraw, augment, draw_augmentation
from vla_scale.models.pi0.normalize import Pi0Normalizer
from vla_scale.models.pi0.policy import Pi0Inputs, pixels_from_uint8
from vla_scale.models.pi0.spec import Pi0Spec
from vla_scale.models.pi0.tokenizer import PaliGemmaTokenizer

TIME_BETA = (1.5, 1.0)
"""openpi's flow-time distribution during training: Beta(1.5, 1), then squeezed into [0.001, 1]."""
TIME_FLOOR = 0.001


def resize_with_pad(image: np.ndarray, side: int) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [side, side, 3]: scaled by the larger ratio (PIL bilinear), sizes truncated to
    integers, centred on black (openpi's `image_tools.resize_with_pad`); an image already that size is kept."""
    height, width = image.shape[:2]
    if (height, width) == (side, side):
        return image
    ratio = max(width / side, height / side)
    new_w, new_h = int(width / ratio), int(height / ratio)
    resized = Image.fromarray(image).resize((new_w, new_h), resample=Image.BILINEAR)
    canvas = Image.new(resized.mode, (side, side), 0)
    canvas.paste(resized, (max(0, int((side - new_w) / 2)), max(0, int((side - new_h) / 2))))
    return np.asarray(canvas)


def pad_last(values: np.ndarray, size: int) -> np.ndarray:
    """float [..., D] -> float32 [..., size], zeros after D (a robot's vector in the model's width)."""
    out = np.zeros((*values.shape[:-1], size), dtype=np.float32)
    out[..., : values.shape[-1]] = values
    return out


@dataclass(frozen=True)
class FlowDraw:
    """One optimizer step's randomness: example indices [B], noise float32[B, H, D], flow times float32[B] and,
    with augmentation, the step's image augmentation (one for every example of the step, as openpi draws one per
    batch)."""

    index: np.ndarray
    noise: np.ndarray
    time: np.ndarray
    augment: AugmentDraw | None = None


@dataclass(frozen=True)
class FlowBatch:
    """A π0 micro-batch: the model's inputs, the normalised padded chunks, their noise and times, and which
    elements are real (float32 [B, H, D]: 1 on unpadded steps and the robot's action dimensions)."""

    inputs: Pi0Inputs
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
class Pi0Demonstrations:
    """Every example of a dataset for a π0 / π0.5 policy, prepared once (module docstring)."""

    images: np.ndarray  # uint8 [N, slots, S, S, 3]
    image_masks: np.ndarray  # bool [slots]
    tokens: np.ndarray  # int64 [N, L]
    token_masks: np.ndarray  # bool [N, L]
    state: np.ndarray  # float32 [N, D]
    actions: np.ndarray  # float32 [N, H, D]
    valid: np.ndarray  # float32 [N, H, D]
    augment: bool = False  # each step's images augmented as openpi trains π0 (`models/pi0/augment.py`)

    @classmethod
    def build(cls, episodes: Sequence[Episode], spec: Pi0Spec, cameras: Sequence[str],
              normalizer: Pi0Normalizer, tokenizer: PaliGemmaTokenizer, augment: bool = False) -> Pi0Demonstrations:
        parts = [_episode_arrays(e, spec, cameras, normalizer, tokenizer) for e in episodes]
        joined = [np.concatenate([p[i] for p in parts]) for i in range(6)]
        masks = np.arange(spec.num_images) < len(cameras)
        return cls(joined[0], masks, *joined[1:], augment=augment)

    def __len__(self) -> int:
        return len(self.state)

    def draw(self, generator: np.random.Generator, batch_size: int) -> FlowDraw:
        index = draw_batches(generator, len(self), batch_size)
        noise = generator.standard_normal((batch_size, *self.actions.shape[1:]))
        time = generator.beta(*TIME_BETA, size=batch_size) * (1 - TIME_FLOOR) + TIME_FLOOR
        augment = draw_augmentation(generator, self.images.shape[1], self.images.shape[2]) if self.augment else None
        return FlowDraw(index, noise.astype(np.float32), time.astype(np.float32), augment)

    def batch(self, draw: FlowDraw, positions: np.ndarray, device: torch.device | str = "cpu") -> FlowBatch:
        i = draw.index[positions]
        batch = len(i)
        images = pixels_from_uint8(torch.from_numpy(self.images[i]).to(device))
        inputs = Pi0Inputs(
            images=images if draw.augment is None else augment(images, draw.augment),
            image_masks=torch.from_numpy(self.image_masks).to(device)[None].expand(batch, -1),
            tokens=torch.from_numpy(self.tokens[i]).to(device),
            token_masks=torch.from_numpy(self.token_masks[i]).to(device),
            state=torch.from_numpy(self.state[i]).to(device))
        return FlowBatch(inputs, torch.from_numpy(self.actions[i]).to(device),
                         torch.from_numpy(draw.noise[positions]).to(device),
                         torch.from_numpy(draw.time[positions]).to(device), torch.from_numpy(self.valid[i]).to(device))


def _episode_arrays(episode: Episode, spec: Pi0Spec, cameras: Sequence[str], normalizer: Pi0Normalizer,
                    tokenizer: PaliGemmaTokenizer) -> tuple[np.ndarray, ...]:
    """One episode's (images, tokens, token masks, state, actions, valid) arrays, one row per step."""
    steps, side = len(episode), spec.vision.image_size
    images = np.zeros((steps, spec.num_images, side, side, 3), dtype=np.uint8)
    for slot, camera in enumerate(cameras):
        images[:, slot] = [resize_with_pad(frame, side) for frame in episode.images[camera]]
    state = normalizer.normalize("state", episode.state.astype(np.float64))
    prompts = [tokenizer.tokenize(episode.instruction, s if spec.state_in_prompt else None) for s in state]
    index, pad = chunk_index(steps, spec.action_horizon)
    actions = normalizer.normalize("actions", episode.actions.astype(np.float64))[index]
    valid = np.zeros((steps, spec.action_horizon, spec.action_dim), dtype=np.float32)
    valid[:, :, : episode.actions.shape[1]] = (~pad)[:, :, None]
    return (images, np.stack([t for t, _ in prompts]), np.stack([m for _, m in prompts]),
            pad_last(state, spec.action_dim), pad_last(actions, spec.action_dim), valid)
