"""π0's training augmentation against openpi's own (`preprocess_observation_pytorch(train=True)`, run by
tests/fixtures/openpi_reference/make_augmentation.py on seeded images with the values it drew): the same draws give
the same images, within float32 rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vla_scale.models.pi0.augment import (
    BRIGHTNESS,
    CONTRAST,
    MAX_DEGREES,
    SATURATION,
    AugmentDraw,
    augment,
    crop_side,
    draw_augmentation,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "openpi_reference" / "augmentation.safetensors"
KEYS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")  # openpi's camera slots, in order
CASES = ("side64_seed7", "side28_seed11", "side96_seed3", "side64_seed123")


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(FIXTURE))


def _openpis_draw(reference: dict[str, torch.Tensor], case: str) -> AugmentDraw:
    """What openpi drew, as our record (its crop and angle are the base camera's; the wrists take none)."""
    drawn = {k.split("/drawn/")[1]: v for k, v in reference.items() if k.startswith(f"{case}/drawn/")}

    def per_slot(what: str) -> np.ndarray:
        return np.array([drawn[f"{key}/{what}"].item() for key in KEYS], dtype=np.float32)

    slots = len(KEYS)
    return AugmentDraw(np.full(slots, int(drawn["top"])), np.full(slots, int(drawn["left"])),
                       np.full(slots, drawn["degrees"].item(), dtype=np.float32), per_slot("brightness"),
                       per_slot("contrast"), per_slot("saturation"))


def _slots(reference: dict[str, torch.Tensor], case: str, part: str) -> torch.Tensor:
    """openpi's [B, H, W, 3] per key as our [B, slots, 3, H, W]."""
    return torch.stack([reference[f"{case}/{part}/{key}"].permute(0, 3, 1, 2) for key in KEYS], dim=1)


@pytest.mark.parametrize("case", CASES)
def test_the_augmentation_is_openpis(reference: dict[str, torch.Tensor], case: str) -> None:
    images, theirs = _slots(reference, case, "input"), _slots(reference, case, "output")
    ours = augment(images, _openpis_draw(reference, case))
    assert ours.shape == theirs.shape and ours.dtype == torch.float32
    assert float((ours - theirs).abs().max()) <= 1e-6
    assert float((theirs - images).abs().max()) > 0.5  # the augmentation did change the images


def test_draws_lie_in_openpis_ranges_and_repeat_with_the_generator() -> None:
    side, slots = 64, 3
    draws = [draw_augmentation(np.random.default_rng(seed), slots, side) for seed in range(200)]
    room = side - crop_side(side)
    for draw in draws:
        assert ((0 <= draw.top) & (draw.top <= room) & (0 <= draw.left) & (draw.left <= room)).all()
        assert (np.abs(draw.degrees) <= MAX_DEGREES).all()
        for values, (low, high) in ((draw.brightness, BRIGHTNESS), (draw.contrast, CONTRAST),
                                    (draw.saturation, SATURATION)):
            assert values.dtype == np.float32 and ((low <= values) & (values <= high)).all()
    assert {int(t) for d in draws for t in d.top} == set(range(room + 1))  # every offset comes up
    again = draw_augmentation(np.random.default_rng(5), slots, side)
    assert all(np.array_equal(a, b) for a, b in zip(vars(again).values(), vars(draws[5]).values(), strict=True))
