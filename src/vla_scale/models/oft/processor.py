"""Observations (numpy, from the simulators) -> PolicyInputs, with the image preprocessing of the official processor.

Per tower (`PrismaticImageProcessor`): resize to the tower's input size, `to_tensor` (x / 255), normalise with the
tower's mean/std; the towers' 3-channel results are stacked on the channel axis (6 channels for DINOv2 + SigLIP),
and several images of one example are stacked after each other (image 0 first). Means and stds come from the
checkpoint's `preprocessor_config.json` when there is one, else from the towers (timm's data configs).

Optional 0.9-area centre crop (OFT's `center_crop_image`, for checkpoints trained with random crops): TensorFlow's
`crop_and_resize` of the centre box of side sqrt(0.9), bilinear, back to the same size, on [0, 1] floats, converted
back to uint8 as TensorFlow does (x * 255.5, truncated); `official_images.centre_crop` reproduces it bit for bit.

Resizing (only when the camera image is not the tower's size): `jpeg_lanczos3` is the official OpenVLA-OFT
evaluation's (a JPEG round trip, then TensorFlow's Lanczos-3 with antialias, reimplemented in
`envs/official_images.py`), what official checkpoints expect: their LIBERO evaluation renders at 256 and resizes
to 224 this way before the crop. `bicubic` is torch's antialiased bicubic, for policies of our own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vla_scale.envs.official_images import ImagePrep, centre_crop
from vla_scale.envs.types import Observation
from vla_scale.models.oft.actions import DatasetStats
from vla_scale.models.oft.spec import OFTSpec
from vla_scale.models.oft.vision import ViTSpec
from vla_scale.models.tokenizer import TextTokenizer, pad_rows, prompt_text


@dataclass
class PolicyInputs:
    """One batch of model inputs, as tensors."""

    pixel_values: Tensor  # float32[B, N*C, S, S]: N images, C = 3 per tower, normalised per tower
    input_ids: Tensor  # int64[B, L], right-padded, BOS first
    attention_mask: Tensor  # bool[B, L]
    proprio: Tensor  # float32[B, d], already normalised

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> PolicyInputs:
        return PolicyInputs(*(t.to(device, non_blocking=True) for t in vars(self).values()))

    def on(self, device: torch.device | str) -> PolicyInputs:
        """These inputs on `device` (as `PreparedInputs.on` makes them)."""
        return self.to(device)

    def trimmed(self) -> PolicyInputs:
        """The prompt columns cut to the batch's longest prompt. Prompts are right-padded to a fixed budget and the
        action slots follow each row's own prompt, so the cut columns are only ever masked keys: every row keeps its
        positions and the logits stay what they were (up to the order of float sums over fewer keys). Read on the
        host, the mask costs no device sync."""
        longest = int(self.attention_mask.sum(dim=1).max())
        return PolicyInputs(self.pixel_values, self.input_ids[:, :longest], self.attention_mask[:, :longest],
                            self.proprio)


@dataclass(frozen=True)
class PreparedInputs:
    """One batch of model inputs kept on the host as the rollout recorded it: the images uint8, the prompts tokenised
    and the proprio normalised. `on(device)` makes the `PolicyInputs` there, normalising the pixels on `device`
    (`ImageTransform.normalize`): an update builds its batches once and moves a quarter of the float32 bytes."""

    images: np.ndarray  # uint8[B, N, S, S, 3], as the towers see them
    input_ids: Tensor  # int64[B, L]
    attention_mask: Tensor  # bool[B, L]
    proprio: Tensor  # float32[B, d], already normalised
    transform: ImageTransform

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: slice | np.ndarray) -> PreparedInputs:
        return PreparedInputs(self.images[index], self.input_ids[index], self.attention_mask[index],
                              self.proprio[index], self.transform)

    def on(self, device: torch.device | str) -> PolicyInputs:
        pixels = self.transform.normalize(self.images, device)
        return PolicyInputs(pixels, *(t.to(device, non_blocking=True)
                                      for t in (self.input_ids, self.attention_mask, self.proprio)))


@dataclass(frozen=True)
class ImageTransform:
    """uint8 images [B, N, H, W, 3] -> pixel_values float32 [B, N * 3 * towers, S, S]."""

    image_size: int
    means: tuple[tuple[float, ...], ...]  # one per tower
    stds: tuple[tuple[float, ...], ...]
    center_crop: bool = False
    crop_area: float = 0.9
    resize: str = "bicubic"  # or "jpeg_lanczos3" (module docstring)

    @classmethod
    def for_spec(cls, spec: OFTSpec, preprocessor: dict | None) -> ImageTransform:
        """A policy's (`OFTSpec`): its checkpoint's preprocessor_config.json when it has one, else its towers'."""
        if preprocessor is not None:
            return cls.from_preprocessor_config(preprocessor, spec.center_crop, spec.image_resize)
        return cls.from_towers(spec.towers, spec.center_crop, spec.image_resize)

    @classmethod
    def from_towers(cls, towers: list[ViTSpec], center_crop: bool, resize: str = "bicubic") -> ImageTransform:
        return cls(towers[0].image_size, tuple(t.mean for t in towers), tuple(t.std for t in towers), center_crop,
                   resize=resize)

    @classmethod
    def from_preprocessor_config(cls, pre: dict, center_crop: bool, resize: str = "bicubic") -> ImageTransform:
        """From an official preprocessor_config.json (the float32 values its Normalize used, when listed)."""
        if pre.get("image_resize_strategy", "resize-naive") != "resize-naive":
            raise ValueError(f"image_resize_strategy {pre['image_resize_strategy']!r} is not supported "
                             "(the OpenVLA-OFT checkpoints use resize-naive)")
        norms = pre.get("tvf_normalize_params") or [{"mean": m, "std": s} for m, s in zip(pre["means"], pre["stds"],
                                                                                          strict=True)]
        return cls(int(pre["input_sizes"][0][-1]), tuple(tuple(n["mean"]) for n in norms),
                   tuple(tuple(n["std"]) for n in norms), center_crop, resize=resize)

    def __call__(self, images: np.ndarray) -> Tensor:
        return self.normalize(self.prepare(images))

    def prepare(self, images: np.ndarray) -> np.ndarray:
        """Camera images uint8 [B, N, H, W, 3] -> the images the towers see, uint8 [B, N, S, S, 3] (resized to the
        towers' size, centre-cropped where the policy wants it). Rollouts record these, so the update normalises
        exactly the pixels the rollout decoded on without resizing again."""
        batch, n, h, w, _ = images.shape
        size = self.image_size
        if self._numpy_prepares(h, w):  # what the simulator processes do: the official resize where needed, the crop
            return ImagePrep(size, self.center_crop, self.crop_area)(images)
        x = torch.from_numpy(np.ascontiguousarray(images)).reshape(batch * n, h, w, 3).permute(0, 3, 1, 2)
        images = resize_uint8(x, size).permute(0, 2, 3, 1).reshape(batch, n, size, size, 3).numpy()
        return centre_crop(images, self.crop_area) if self.center_crop else np.ascontiguousarray(images)

    def simulator_prep(self, camera_resolution: int, cameras: tuple[str, ...]) -> ImagePrep | None:
        """The same preparation done in numpy inside the simulator processes, where it can be (no resize, or the
        official one); None where it needs torch (bicubic)."""
        if not self._numpy_prepares(camera_resolution, camera_resolution):
            return None
        return ImagePrep(self.image_size, self.center_crop, self.crop_area, tuple(cameras))

    def _numpy_prepares(self, h: int, w: int) -> bool:
        return self.resize == "jpeg_lanczos3" or (h, w) == (self.image_size, self.image_size)

    def normalize(self, images: np.ndarray, device: torch.device | str = "cpu") -> Tensor:
        """Prepared images uint8 [B, N, S, S, 3] -> pixel_values float32 [B, N * 3 * towers, S, S] on `device`.

        On a GPU the uint8 images travel (a quarter of the float32 bytes) and are looked up in the same table there:
        bitwise the same values, without the host's pass over every pixel of every tower (the largest host cost of a
        decode inside the env loop; docs/performance.md)."""
        batch, n, h, w, _ = images.shape
        if (h, w) != (self.image_size, self.image_size):
            raise ValueError(f"prepared images must be {self.image_size}x{self.image_size}, got {h}x{w}")
        if torch.device(device).type != "cpu":
            return self._normalize_on(images, torch.device(device))
        channels = np.ascontiguousarray(images.reshape(batch * n, h, w, 3).transpose(0, 3, 1, 2))
        table = self._table()
        pixels = np.empty((batch * n, len(table), h, w), dtype=np.float32)
        for k, row in enumerate(table):
            np.take(row, channels[:, k % 3], out=pixels[:, k])
        return torch.from_numpy(pixels).reshape(batch, n * len(table), h, w)

    def _normalize_on(self, images: np.ndarray, device: torch.device) -> Tensor:
        batch, n, h, w, _ = images.shape
        key = (self.means, self.stds, str(device))
        table = _DEVICE_TABLES.get(key)
        if table is None:
            table = _DEVICE_TABLES[key] = torch.from_numpy(self._table()).to(device)
        channels = torch.from_numpy(np.ascontiguousarray(images)).to(device).reshape(batch * n, h, w, 3)
        channels = channels.permute(0, 3, 1, 2).long()
        pixels = torch.stack([table[k][channels[:, k % 3]] for k in range(table.shape[0])], dim=1)
        return pixels.reshape(batch, n * table.shape[0], h, w)

    def _table(self) -> np.ndarray:
        """float32[3 * towers, 256]: the normalised value of every uint8 level, per output channel.

        Computed with the same float32 operations as `(x.float() / 255 - mean) / std` on the 256 levels, so looking
        a pixel up gives bitwise what computing it does, in one pass instead of four.
        """
        cached = _TABLES.get((self.means, self.stds))
        if cached is None:
            unit = torch.arange(256, dtype=torch.float32).view(1, 1, 1, 256) / 255.0
            towers = [(unit - _column(mean)) / _column(std) for mean, std in zip(self.means, self.stds, strict=True)]
            cached = _TABLES[(self.means, self.stds)] = torch.cat(towers, dim=1).reshape(-1, 256).numpy()
        return cached

    def preprocessor_config(self) -> dict:
        """The official preprocessor_config.json (resize-naive, bicubic) describing this transform."""
        size = [3, self.image_size, self.image_size]
        norms = [{"inplace": False, "mean": list(m), "std": list(s)} for m, s in zip(self.means, self.stds,
                                                                                      strict=True)]
        towers = len(self.means)
        return {"image_processor_type": "PrismaticImageProcessor", "image_resize_strategy": "resize-naive",
                "input_sizes": [size] * towers, "interpolations": ["bicubic"] * towers,
                "means": [list(m) for m in self.means], "stds": [list(s) for s in self.stds],
                "tvf_crop_params": [{"output_size": size[1:]}] * towers, "tvf_do_letterbox": False,
                "tvf_letterbox_fill": None, "tvf_normalize_params": norms,
                "tvf_resize_params": [{"antialias": True, "interpolation": 3, "max_size": None,
                                       "size": size[1:]}] * towers,
                "use_fused_vision_backbone": towers == 2}


_TABLES: dict[tuple, np.ndarray] = {}
_DEVICE_TABLES: dict[tuple, Tensor] = {}  # the same tables, copied to a device once


def _column(values: tuple[float, ...]) -> Tensor:
    return torch.tensor(values, dtype=torch.float32).view(1, -1, 1, 1)


def resize_uint8(x: Tensor, size: int) -> Tensor:
    """uint8 [B, 3, H, W] -> uint8 [B, 3, size, size], antialiased bicubic."""
    out = F.interpolate(x.float(), size=(size, size), mode="bicubic", antialias=True, align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


class Processor:
    """Observations (or arrays) -> PolicyInputs for one policy.

    `transform`: camera images -> pixel values (`ImageTransform`). `cameras`: the observation images fed to the
    policy, in order (the first is the primary view). `stats`: the dataset statistics that normalise proprio
    (official checkpoints); None passes proprio through. `max_text_len`: prompt tokens after padding; every batch
    pads to it, so a row's input does not depend on the rest of its batch. 0 pads each batch to its longest prompt
    (for one-off predictions; rollouts and updates use a fixed budget, `run_policy.vla_for_env` sizes it from the
    suite). `for_spec` takes all but the cameras and the budget from a policy's spec.
    """

    def __init__(self, tokenizer: TextTokenizer, transform: ImageTransform, cameras: tuple[str, ...] = ("agentview",),
                 stats: DatasetStats | None = None, max_text_len: int = 0):
        self.tokenizer, self.transform, self.stats = tokenizer, transform, stats
        self.cameras = tuple(cameras)
        self.max_text_len = max_text_len
        self._ids: dict[str, list[int]] = {}  # instruction -> prompt ids (rollouts repeat a few instructions)

    @classmethod
    def for_spec(cls, spec: OFTSpec, tokenizer: TextTokenizer, cameras: tuple[str, ...] = ("agentview",),
                 preprocessor: dict[str, Any] | None = None, max_text_len: int = 0) -> Processor:
        """The processor of a policy of `spec` (its `unnorm_key` resolved): its image pipeline (`preprocessor`: the
        checkpoint's preprocessor_config.json, else its towers') and the statistics of its `unnorm_key`."""
        stats = DatasetStats.from_json(spec.norm_stats[spec.unnorm_key], spec.normalization) if spec.unnorm_key \
            else None
        return cls(tokenizer, ImageTransform.for_spec(spec, preprocessor), cameras, stats, max_text_len)

    def __call__(self, observations: list[Observation]) -> PolicyInputs:
        images, proprio = self.prepare(observations)
        return self.from_prepared(images, [o.instruction for o in observations], proprio)

    def prepare(self, observations: list[Observation], prepared: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The images as the towers see them, uint8 [B, N, S, S, 3] (cameras in order), and the raw proprio [B, d]:
        what a rollout records, so that `from_prepared` gives the update the rollout's exact inputs. `prepared`:
        the simulators made them already (`simulator_prep`)."""
        missing = [c for c in self.cameras if observations and c not in observations[0].images]
        if missing:
            raise ValueError(f"the policy takes cameras {list(self.cameras)}; the observations have "
                             f"{sorted(observations[0].images)}")
        images = np.stack([np.stack([o.images[c] for c in self.cameras]) for o in observations])
        proprio = np.stack([o.proprio for o in observations])
        return (images if prepared else self.transform.prepare(images)), proprio

    def from_arrays(self, images: np.ndarray, instructions: list[str], proprio: np.ndarray) -> PolicyInputs:
        """Camera images uint8 [B, H, W, 3] or [B, N, H, W, 3]; proprio raw [B, d]."""
        if images.ndim == 4:
            images = images[:, None]
        return self.from_prepared(self.transform.prepare(images), instructions, proprio)

    def from_prepared(self, images: np.ndarray, instructions: list[str], proprio: np.ndarray,
                      device: torch.device | str = "cpu") -> PolicyInputs:
        """Prepared images uint8 [B, N, S, S, 3] (`prepare`); proprio raw [B, d]. The pixels are normalised on
        `device`, where the policy runs (`ImageTransform.normalize`); the rest stays on the host."""
        prepared = self.encode(images, instructions, proprio)
        pixels = self.transform.normalize(images, device)
        return PolicyInputs(pixels, prepared.input_ids, prepared.attention_mask, prepared.proprio)

    def encode(self, images: np.ndarray, instructions: list[str], proprio: np.ndarray) -> PreparedInputs:
        """Prepared images uint8 [B, N, S, S, 3] (`prepare`) and raw proprio [B, d] -> the host-side inputs whose
        pixels are normalised where they run (`PreparedInputs.on`)."""
        if self.stats is not None:
            proprio = self.stats.normalize_proprio(proprio)
        ids, mask = self._encode(instructions)
        proprio_t = torch.from_numpy(np.asarray(proprio, dtype=np.float32))
        return PreparedInputs(np.ascontiguousarray(images), torch.from_numpy(ids), torch.from_numpy(mask), proprio_t,
                              self.transform)

    def prompt_ids(self, instruction: str) -> list[int]:
        """The ids of the instruction's official prompt (BOS first), each instruction tokenised once."""
        ids = self._ids.get(instruction)
        if ids is None:
            ids = self._ids[instruction] = self.tokenizer.prompt_ids(prompt_text(instruction))
        return ids

    def _encode(self, instructions: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and mask [B, max_text_len], right-padded."""
        rows = [self.prompt_ids(text) for text in instructions]
        budget = self.max_text_len or max((len(r) for r in rows), default=1)
        return pad_rows(rows, budget, self.tokenizer.pad_id, instructions)
