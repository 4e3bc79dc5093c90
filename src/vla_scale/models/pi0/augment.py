"""The image augmentation openpi's PyTorch π0 applies to every training batch (`preprocessing_pytorch.py` with
`train=True`, at the openpi commit of tests/fixtures/openpi_reference/COMMIT), for SFT (`sft.image_augmentation`).

Per camera slot, one draw for the whole batch, as openpi draws one per forward:
- the primary slot (slot 0, openpi's `base_0_rgb`; the wrist slots are spared): a crop of 95 % of each side at a
  uniform offset, resized back bilinearly; then a rotation by a uniform angle in [-5, 5] degrees (skipped below 0.1)
  sampled bilinearly with zeros outside, on openpi's grid (`linspace(-1, 1)` taken as `align_corners=False`
  coordinates, as openpi builds it);
- every slot: brightness x U(0.7, 1.3); contrast about the image's mean x U(0.6, 1.4); saturation about the pixel's
  channel mean x U(0.5, 1.5); clamped to [0, 1].
The images enter and leave in [-1, 1] (the model's range), the augmentation itself runs in [0, 1], float32. The draws
come from the step's numpy generator (`draw_augmentation`), so the split over ranks and micro-batches never changes
them and a resumed run draws what the uninterrupted one did.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

CROP = 0.95
"""The side of the crop, as a share of the image's."""
MAX_DEGREES = 5.0
MIN_DEGREES = 0.1
"""Rotations of at most this many degrees are skipped."""
BRIGHTNESS, CONTRAST, SATURATION = (0.7, 1.3), (0.6, 1.4), (0.5, 1.5)
GEOMETRIC_SLOTS = (0,)
"""The slots cropped and rotated (openpi's base camera; its wrist cameras are only recoloured)."""


@dataclass(frozen=True)
class AugmentDraw:
    """One step's augmentation, per slot [slots]: crop offsets (rows, columns), angle in degrees, brightness,
    contrast and saturation factors (float32, as openpi draws them)."""

    top: np.ndarray
    left: np.ndarray
    degrees: np.ndarray
    brightness: np.ndarray
    contrast: np.ndarray
    saturation: np.ndarray


def crop_side(side: int) -> int:
    return int(side * CROP)


def draw_augmentation(generator: np.random.Generator, slots: int, side: int) -> AugmentDraw:
    """The step's draws for `slots` camera slots of `side` x `side` images."""
    room = side - crop_side(side)

    def factor(bounds: tuple[float, float]) -> np.ndarray:
        low, high = bounds
        return (np.float32(low) + generator.random(slots, dtype=np.float32) * np.float32(high - low)).astype(np.float32)

    top, left = (generator.integers(0, room + 1, slots) for _ in range(2))
    degrees = (generator.random(slots, dtype=np.float32) * np.float32(2 * MAX_DEGREES)
               - np.float32(MAX_DEGREES)).astype(np.float32)
    return AugmentDraw(top, left, degrees, factor(BRIGHTNESS), factor(CONTRAST), factor(SATURATION))


def augment(images: Tensor, draw: AugmentDraw) -> Tensor:
    """float32 [B, slots, 3, S, S] in [-1, 1] -> the same, augmented slot by slot with `draw` (module docstring)."""
    slots = [_augment_slot(images[:, slot] / 2.0 + 0.5, draw, slot) for slot in range(images.shape[1])]
    return torch.stack(slots, dim=1) * 2.0 - 1.0


def _augment_slot(image: Tensor, draw: AugmentDraw, slot: int) -> Tensor:
    """One slot's images [B, 3, S, S] in [0, 1]."""
    if slot in GEOMETRIC_SLOTS:
        image = _rotated(_cropped(image, int(draw.top[slot]), int(draw.left[slot])), float(draw.degrees[slot]))
    image = image * _scalar(draw.brightness[slot], image)
    mean = image.mean(dim=(1, 2, 3), keepdim=True)
    image = (image - mean) * _scalar(draw.contrast[slot], image) + mean
    gray = image.mean(dim=1, keepdim=True)
    image = gray + (image - gray) * _scalar(draw.saturation[slot], image)
    return image.clamp(0.0, 1.0)


def _scalar(value: np.float32, like: Tensor) -> Tensor:
    return torch.tensor(float(value), dtype=torch.float32, device=like.device)


def _cropped(image: Tensor, top: int, left: int) -> Tensor:
    """The crop at (`top`, `left`) resized back to the image's side (bilinear, half-pixel centres)."""
    height, width = image.shape[-2:]
    rows, columns = crop_side(height), crop_side(width)
    if height == rows or width == columns:
        return image
    window = image[..., top: top + rows, left: left + columns]
    return F.interpolate(window, size=(height, width), mode="bilinear", align_corners=False)


def _rotated(image: Tensor, degrees: float) -> Tensor:
    """`image` turned by `degrees` about its centre on openpi's sampling grid (zeros outside)."""
    if abs(degrees) <= MIN_DEGREES:
        return image
    radians = torch.tensor(degrees, dtype=torch.float32) * torch.pi / 180.0
    cos, sin = torch.cos(radians), torch.sin(radians)
    height, width = image.shape[-2:]
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij")
    grid = torch.stack([xs * cos - ys * sin, xs * sin + ys * cos], dim=-1).to(image.device)
    grid = grid.unsqueeze(0).expand(len(image), -1, -1, -1)
    return F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
