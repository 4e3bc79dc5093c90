"""Camera images as LeRobot's SmolVLA prepares them inside its policy, before the tower reads them.

LeRobot's `SmolVLAPolicy.prepare_images` takes each camera's float image [B, 3, H, W] in [0, 1], resizes it to fit
`resize_imgs_with_padding` keeping its aspect ratio (bilinear, no antialiasing; the side that fits is rounded down),
pads it with zeros on the left and the top (not centred, unlike openpi's), and maps [0, 1] to [-1, 1] (so the padding
becomes -1). Here the same, as functions a source calls before it builds `FlowInputs`.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def resize_with_pad(images: Tensor, width: int, height: int) -> Tensor:
    """Float images [..., C, H, W] -> [..., C, height, width]: the largest bilinear resize that fits, zero padding on
    the left and top; images already of that size are returned as they are."""
    current_height, current_width = images.shape[-2:]
    if (current_height, current_width) == (height, width):
        return images
    ratio = max(current_width / width, current_height / height)
    new_height, new_width = int(current_height / ratio), int(current_width / ratio)
    flat = images.reshape(-1, *images.shape[-3:])
    resized = F.interpolate(flat, size=(new_height, new_width), mode="bilinear", align_corners=False)
    padded = F.pad(resized, (max(0, width - new_width), 0, max(0, height - new_height), 0), value=0.0)
    return padded.reshape(*images.shape[:-2], *padded.shape[-2:])


def tower_pixels(images: Tensor, resize: tuple[int, int] | None) -> Tensor:
    """Float images [..., 3, H, W] in [0, 1] -> what the tower reads, in [-1, 1]: resized and padded to `resize`
    ((width, height), the spec's `resize_imgs_with_padding`; None: as they are)."""
    if resize is not None:
        images = resize_with_pad(images, resize[0], resize[1])
    return images * 2.0 - 1.0
