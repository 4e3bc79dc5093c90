"""π0 / π0.5's demonstrations -> what the flow-matching loss trains on: the flow families' examples
(`models/flow/demonstrations.py`) on π0's layout (`rollout.layout`), with openpi's resize and its training
augmentation.

Images are resized to the tower's side with padding (the aspect ratio kept, the rest black; PIL's bilinear filter on
uint8, openpi's `resize_with_pad`); states and actions are normalised with the demonstrations' statistics (z-score for
π0, quantiles for π0.5); the prompt goes through the PaliGemma tokenizer (π0.5 with the discretised state).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from vla_scale.models.flow.demonstrations import (
    TIME_BETA,
    TIME_FLOOR,
    Augmentation,
    FlowBatch,
    FlowDemonstrations,
    FlowDraw,
)
from vla_scale.models.flow.layout import pad_last
from vla_scale.models.pi0.augment import augment, draw_augmentation

Pi0Demonstrations = FlowDemonstrations
"""π0's name of the flow families' demonstrations."""
OPENPI_AUGMENTATION = Augmentation(draw=draw_augmentation, apply=augment)
"""openpi's training augmentation of π0's images (`models/pi0/augment.py`)."""

__all__ = ["OPENPI_AUGMENTATION", "TIME_BETA", "TIME_FLOOR", "FlowBatch", "FlowDraw", "Pi0Demonstrations", "pad_last",
           "resize_with_pad"]


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
