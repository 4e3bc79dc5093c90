"""Image preprocessing: per-tower normalisation, several cameras, resize, the 0.9-area centre crop."""

import numpy as np
import pytest
import torch

from vla_scale.config import ModelConfig
from vla_scale.envs.official_images import centre_crop
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import Observation
from vla_scale.models.oft import ImageTransform, Processor
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.run_policy import spec_from_model_config

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def test_each_tower_gets_its_own_normalisation_and_images_stack_on_channels():
    transform = ImageTransform(16, (IMAGENET[0], (0.5, 0.5, 0.5)), (IMAGENET[1], (0.5, 0.5, 0.5)))
    images = np.random.default_rng(0).integers(0, 256, (2, 3, 16, 16, 3), dtype=np.uint8)
    pixels = transform(images)
    assert pixels.shape == (2, 18, 16, 16) and pixels.dtype == torch.float32
    unit = torch.from_numpy(images[1, 2]).permute(2, 0, 1).float() / 255.0
    mean, std = torch.tensor(IMAGENET[0]).view(3, 1, 1), torch.tensor(IMAGENET[1]).view(3, 1, 1)
    torch.testing.assert_close(pixels[1, 12:15], (unit - mean) / std, rtol=0, atol=0)
    torch.testing.assert_close(pixels[1, 15:18], unit * 2 - 1, rtol=0, atol=1e-7)


def test_timm_towers_bring_their_data_config():
    cfg = ModelConfig(timm_model_ids=["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"],
                      image_size=224, patch_size=14)
    transform = ImageTransform.for_spec(spec_from_model_config(cfg, 100, 2), None)
    assert transform.means == (IMAGENET[0], (0.5, 0.5, 0.5)) and transform.stds[0] == IMAGENET[1]


def test_processor_reads_every_camera_and_resizes():
    tok = WordTokenizer.from_instructions(instructions())
    cfg = ModelConfig(image_size=32, patch_size=8)
    proc = Processor.for_spec(spec_from_model_config(cfg, tok.vocab_size, tok.eos_id), tok, ("agentview", "wrist"))
    rng = np.random.default_rng(0)
    obs = [Observation({"agentview": rng.integers(0, 256, (48, 48, 3), dtype=np.uint8),
                        "wrist": np.zeros((48, 48, 3), np.uint8)}, np.zeros(4, np.float32), "reach the red block")]
    batch = proc(obs)
    assert batch.pixel_values.shape == (1, 6, 32, 32)
    assert torch.all(batch.pixel_values[0, 3:] == -1.0) and batch.pixel_values[0, :3].std() > 0.3


def test_centre_crop_keeps_the_centre_box_of_the_area():
    """A horizontal ramp: the crop keeps columns lo..hi of the box with side sqrt(0.9), as TF crop_and_resize."""
    w = 224
    ramp = np.broadcast_to(np.arange(w, dtype=np.uint8)[None, :, None], (w, w, 3))
    out = centre_crop(ramp[None], 0.9)
    side = np.sqrt(np.float32(0.9))
    lo = (1 - side) / 2
    expected_cols = (lo + np.arange(w) * side / (w - 1)) * (w - 1)
    got = out[0, w // 2, :, 0].astype(np.float64)
    assert np.abs(got - np.floor(expected_cols / 255 * 255.5)).max() <= 1
    assert out.shape == (1, w, w, 3) and out.dtype == np.uint8
    flat = np.full((1, w, w, 3), 200, dtype=np.uint8)
    np.testing.assert_array_equal(centre_crop(flat, 0.9), flat)


def _normalised_both_ways(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    transform = ImageTransform(24, (IMAGENET[0], (0.5, 0.5, 0.5)), (IMAGENET[1], (0.5, 0.5, 0.5)))
    images = np.random.default_rng(3).integers(0, 256, (3, 2, 24, 24, 3), dtype=np.uint8)  # every level, 2 cameras
    on_host = transform.normalize(images)
    there = transform._normalize_on(images, torch.device(device)) if device == "cpu" else transform.normalize(
        images, device)
    return on_host, there.cpu()


def test_normalising_where_the_policy_runs_gives_the_hosts_values_bit_for_bit():
    on_host, there = _normalised_both_ways("cpu")  # the device path's operations, run on the CPU
    assert there.shape == on_host.shape == (3, 12, 24, 24) and there.dtype == torch.float32
    assert torch.equal(there, on_host)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_normalising_on_the_gpu_gives_the_hosts_values_bit_for_bit():
    on_host, there = _normalised_both_ways("cuda")
    assert torch.equal(there, on_host)
