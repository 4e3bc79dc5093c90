"""What a flow-matching family's inputs look like to the pieces they share (its processor, demonstrations, decoder
and scorer): `FlowLayout` (image side and slots, horizon, widths, the family's resize), and the tokenizer and
normaliser they call, as protocols. No torch here: a source checks an env and data without building the model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class FlowLayout:
    image_size: int
    """The side every camera image is resized to (with padding) before the vision tower."""
    num_images: int
    """Camera slots of the model; the env's cameras fill the first, the rest are masked."""
    action_horizon: int
    """Actions per chunk (H)."""
    action_dim: int
    """The model's action width (D): a robot's actions are zero-padded to it."""
    state_dim: int
    """The model's state width: a robot's proprio is normalised and zero-padded to it."""
    num_steps: int
    """Euler steps of the denoising chain."""
    resize: Callable[[np.ndarray, int], np.ndarray]
    """uint8 [H, W, 3] -> uint8 [side, side, 3], as the family's reference pipeline resizes a frame."""
    state_in_prompt: bool = False
    """The tokenizer reads the normalised state too (π0.5's discretised state)."""


class PromptTokenizer(Protocol):
    """A family's prompt: the instruction (and, where the family puts it there, the normalised state) as ids."""

    def tokenize(self, text: str, state: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(int64 ids [L], bool mask [L]), padded to the family's budget."""
        ...

    def prompt_ids(self, text: str, state: np.ndarray | None = None) -> list[int]:
        """The prompt's ids before padding (its length is what must fit the budget)."""
        ...


class Normalizer(Protocol):
    """States and actions to the model's scale and back, from a dataset's statistics."""

    def normalize(self, key: str, values: np.ndarray) -> np.ndarray: ...

    def unnormalize(self, key: str, values: np.ndarray) -> np.ndarray: ...


def pad_last(values: np.ndarray, size: int) -> np.ndarray:
    """float [..., D] -> float32 [..., size], zeros after D (a robot's vector in the model's width)."""
    out = np.zeros((*values.shape[:-1], size), dtype=np.float32)
    out[..., : values.shape[-1]] = values
    return out


def pixels_from_uint8(images: Tensor) -> Tensor:
    """Camera images uint8[..., H, W, 3] -> float32[..., 3, H, W] in [-1, 1] (x / 255 * 2 - 1: openpi's conversion,
    and LeRobot's of its [0, 1] frames)."""
    import torch

    return images.to(torch.float32).movedim(-1, -3) / 255.0 * 2.0 - 1.0
