"""π0's frames are resized as openpi resizes them: `models/pi0/demonstrations.resize_with_pad` against openpi's own
`openpi_client.image_tools.resize_with_pad` (openpi-client 0.1.2 from PyPI, the same file as openpi's pinned commit's
`packages/openpi-client`, which openpi's `ResizeImages` transform and its LIBERO client call), pixel for pixel, on
LIBERO's and Meta-World's frame sizes, on noise and on smooth images."""

from __future__ import annotations

import numpy as np
import pytest

from vla_scale.models.pi0.demonstrations import resize_with_pad

openpi_tools = pytest.importorskip("openpi_client.image_tools",
                                   reason="openpi-client is the reference (make installs it)")


def _frames(height: int, width: int, seed: int) -> list[np.ndarray]:
    """Noise, and a smooth image with edges (gradients and a bright square), uint8 [height, width, 3]."""
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    y, x = np.mgrid[0:height, 0:width]
    smooth = np.stack([255 * x / max(width - 1, 1), 255 * y / max(height - 1, 1), 128 + 0 * x], axis=-1)
    smooth[height // 3: height // 2, width // 4: width // 2] = 250
    return [noise, smooth.astype(np.uint8)]


@pytest.mark.parametrize(("height", "width", "side"), [
    (256, 256, 224),  # LIBERO's agentview and wrist frames, to openpi's 224
    (480, 480, 224),  # Meta-World's corner2 as LeRobot renders it
    (480, 640, 224),  # a wider camera: padded top and bottom
    (300, 200, 224),  # a taller one: padded left and right
    (128, 128, 224),  # upsampled
    (64, 64, 28),  # the tiny π0's tower
    (224, 224, 224),  # already the size: kept as it is
])
def test_resize_with_pad_is_openpis_pixel_for_pixel(height: int, width: int, side: int) -> None:
    for frame in _frames(height, width, seed=height * 1000 + width):
        ours = resize_with_pad(frame, side)
        theirs = openpi_tools.resize_with_pad(frame, side, side)
        assert ours.shape == theirs.shape == (side, side, 3) and ours.dtype == theirs.dtype == np.uint8
        np.testing.assert_array_equal(ours, theirs)
