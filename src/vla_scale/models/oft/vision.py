"""The vision backbone of OpenVLA(-OFT): one or two ViT towers (e.g. DINOv2 with registers + SigLIP), fused per patch.

Why native towers instead of timm: timm's data module imports torchvision, and PyPI's torchvision is a CUDA build
that fails to import beside the CPU torch this project installs (`operator torchvision::nms does not exist`);
transformers' own Dinov2/Siglip models name and lay out their weights differently from the official checkpoints. The
ViT below is small, keeps timm's parameter names (so an official `model.safetensors` loads key for key) and
reproduces what the official featurizer computes: patch embedding, position embedding (added before or after the
class/register tokens, as timm does), optional pre-norm (CLIP), pre-norm blocks with optional LayerScale (stored as
`ls*.scale_factor`, the official rename of timm's `gamma`), and the output of the second-to-last block without the
final norm, prefix tokens dropped (`get_intermediate_layers`).

Modules an official tower owns but never runs (the last block, the final norm, SigLIP's attention-pool head) are
kept so that checkpoints round-trip, and frozen: no gradient ever reaches them.

FiLM (OpenVLA-OFT+'s language conditioning, `--use_film`): each block also holds two projections of the average
language embedding of the prompt, `scale` and `shift`, and modulates its features between the attention and the
MLP, x <- x * (1 + scale(l)) + shift(l), the same gamma and beta for every patch of an image.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

IMAGENET_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HALF_MEAN_STD = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
CLIP_MEAN_STD = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))


@dataclass(frozen=True)
class ViTSpec:
    """Everything that fixes a tower's weights and computation (and its input normalisation)."""

    image_size: int
    patch_size: int
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float = 4.0
    class_token: bool = True
    reg_tokens: int = 0
    no_embed_class: bool = False  # position embedding covers the patches only (added before the prefix tokens)
    layer_scale: bool = False
    pre_norm: bool = False  # CLIP: LayerNorm after the position embedding, patch projection without bias
    map_head: bool = False  # SigLIP: attention-pool head (kept for the checkpoint layout, never run)
    act: str = "gelu"
    norm_eps: float = 1e-6
    feature_block: int = -2  # features = output of this block (python index); official: second-to-last
    norm_features: bool = False  # apply the final norm to the features (official: no)
    mean: tuple[float, float, float] = HALF_MEAN_STD[0]
    std: tuple[float, float, float] = HALF_MEAN_STD[1]

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + self.reg_tokens

    @property
    def blocks_run(self) -> int:
        """Blocks the forward pass needs (those after `feature_block` never influence the features)."""
        return self.feature_block % self.depth + 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTSpec:
        d = dict(d)
        d["mean"], d["std"] = tuple(d["mean"]), tuple(d["std"])
        return cls(**d)


_SIZES = {"tiny": (192, 12, 3), "small": (384, 12, 6), "base": (768, 12, 12), "large": (1024, 24, 16),
          "huge": (1280, 32, 16)}
_ARCHS: dict[str, dict[str, Any]] = {
    "vit_large_patch14_reg4_dinov2": dict(patch_size=14, embed_dim=1024, depth=24, num_heads=16, layer_scale=True,
                                          reg_tokens=4, no_embed_class=True, mean_std=IMAGENET_MEAN_STD),
    "vit_so400m_patch14_siglip_224": dict(patch_size=14, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362,
                                          class_token=False, map_head=True, mean_std=HALF_MEAN_STD),
    "vit_large_patch14_clip_224": dict(patch_size=14, embed_dim=1024, depth=24, num_heads=16, pre_norm=True,
                                       norm_eps=1e-5, mean_std=CLIP_MEAN_STD),
}
_ARCHS["vit_so400m_patch14_siglip_384"] = _ARCHS["vit_so400m_patch14_siglip_224"]
_ARCHS["vit_large_patch14_clip_336"] = _ARCHS["vit_large_patch14_clip_224"]
_PLAIN = re.compile(r"vit_(tiny|small|base|large|huge)_patch(\d+)_\d+")


def timm_vit_spec(timm_id: str, image_size: int, act_override: str | None = None) -> ViTSpec:
    """The tower timm builds for `timm_id` (pretrained tag ignored) at `image_size`, as the official code creates it."""
    arch = timm_id.split(".")[0]
    if arch in _ARCHS:
        args = dict(_ARCHS[arch])
    elif (match := _PLAIN.fullmatch(arch)) is not None:
        dim, depth, heads = _SIZES[match.group(1)]
        args = dict(patch_size=int(match.group(2)), embed_dim=dim, depth=depth, num_heads=heads,
                    mean_std=HALF_MEAN_STD)
    else:
        raise ValueError(f"unknown vision tower {timm_id!r}: known are {sorted(_ARCHS)} and plain "
                         "vit_{tiny,small,base,large,huge}_patch<P>_<S>")
    (mean, std) = args.pop("mean_std")
    spec = ViTSpec(image_size=image_size, mean=mean, std=std, **args)
    return replace(spec, act=act_override) if act_override else spec


def _activation(name: str) -> nn.Module:
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "quick_gelu":
        return QuickGELU()
    raise ValueError(f"unknown activation {name!r} (gelu, gelu_tanh, quick_gelu)")


def quick_gelu(x: Tensor) -> Tensor:
    """x * sigmoid(1.702 x), the activation of OpenAI's CLIP."""
    return x * torch.sigmoid(1.702 * x)


class QuickGELU(nn.Module):
    """`quick_gelu` as a module."""

    def forward(self, x: Tensor) -> Tensor:
        return quick_gelu(x)


class LayerScale(nn.Module):
    """Per-channel scale; the parameter is named `scale_factor` as in the official checkpoints."""

    def __init__(self, dim: int, init: float = 1e-5):
        super().__init__()
        self.scale_factor = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale_factor


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), _activation(act), nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    """Pre-norm transformer block (timm `Block`); with `film_dim` > 0, FiLMed by a language embedding of that size
    (module docstring)."""

    def __init__(self, spec: ViTSpec, film_dim: int = 0):
        super().__init__()
        dim = spec.embed_dim
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=spec.norm_eps), nn.LayerNorm(dim, eps=spec.norm_eps)
        self.attn = Attention(dim, spec.num_heads)
        self.mlp = Mlp(dim, int(dim * spec.mlp_ratio), spec.act)
        self.ls1 = LayerScale(dim) if spec.layer_scale else nn.Identity()
        self.ls2 = LayerScale(dim) if spec.layer_scale else nn.Identity()
        if film_dim:
            self.scale, self.shift = nn.Linear(film_dim, dim), nn.Linear(film_dim, dim)

    def forward(self, x: Tensor, language: Tensor | None = None) -> Tensor:
        """`language` [B, film_dim]: the average prompt embedding of each image's example (FiLMed blocks only)."""
        x = x + self.ls1(self.attn(self.norm1(x)))
        if language is not None:
            x = film(x, self.scale(language), self.shift(language))
        return x + self.ls2(self.mlp(self.norm2(x)))


def film(x: Tensor, gamma: Tensor, beta: Tensor) -> Tensor:
    """x [B, N, D] modulated per feature: x * (1 + gamma) + beta, gamma and beta [B, D] shared by the N tokens."""
    return x * (1 + gamma.unsqueeze(1)) + beta.unsqueeze(1)


class PatchEmbed(nn.Module):
    def __init__(self, spec: ViTSpec):
        super().__init__()
        p = spec.patch_size
        self.proj = nn.Conv2d(3, spec.embed_dim, kernel_size=p, stride=p, bias=not spec.pre_norm)

    def forward(self, pixels: Tensor) -> Tensor:
        return self.proj(pixels).flatten(2).transpose(1, 2)


class AttentionPoolHead(nn.Module):
    """SigLIP's attention-pool head (timm `AttentionPoolLatent`): parameters only, never run by the featurizer."""

    def __init__(self, spec: ViTSpec):
        super().__init__()
        dim = spec.embed_dim
        self.latent = nn.Parameter(torch.randn(1, 1, dim) * dim**-0.5)
        self.q, self.kv, self.proj = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=spec.norm_eps)
        self.mlp = Mlp(dim, int(dim * spec.mlp_ratio), spec.act)


class ViT(nn.Module):
    """One tower: pixels [B, 3, S, S] -> patch features [B, patches, dim] (see the module docstring)."""

    def __init__(self, spec: ViTSpec, film_dim: int = 0):
        super().__init__()
        self.spec = spec
        self.film_dim = film_dim
        dim = spec.embed_dim
        self.patch_embed = PatchEmbed(spec)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02) if spec.class_token else None
        self.reg_token = nn.Parameter(torch.randn(1, spec.reg_tokens, dim) * 0.02) if spec.reg_tokens else None
        positions = spec.num_patches + (0 if spec.no_embed_class else spec.num_prefix_tokens)
        self.pos_embed = nn.Parameter(torch.randn(1, positions, dim) * 0.02)
        self.norm_pre = nn.LayerNorm(dim, eps=spec.norm_eps) if spec.pre_norm else nn.Identity()
        self.blocks = nn.ModuleList(Block(spec, film_dim) for _ in range(spec.depth))
        self.norm = nn.LayerNorm(dim, eps=spec.norm_eps)
        self.attn_pool = AttentionPoolHead(spec) if spec.map_head else None
        self.checkpointing = False  # recompute each block's activations in the backward pass (training only)
        self._freeze_unused()

    def _freeze_unused(self) -> None:
        unused: list[nn.Module] = list(self.blocks[self.spec.blocks_run :])
        if not self.spec.norm_features:
            unused.append(self.norm)
        if self.attn_pool is not None:
            unused.append(self.attn_pool)
        for module in unused:
            module.requires_grad_(False)

    def _prefix_and_positions(self, x: Tensor) -> Tensor:
        prefix = [t.expand(x.shape[0], -1, -1).to(x.dtype) for t in (self.cls_token, self.reg_token) if t is not None]
        if self.spec.no_embed_class:
            return torch.cat(prefix + [x + self.pos_embed.to(x.dtype)], dim=1)
        return torch.cat(prefix + [x], dim=1) + self.pos_embed.to(x.dtype)

    def forward(self, pixels: Tensor, language: Tensor | None = None) -> Tensor:
        """`language` [B, film_dim]: what a FiLMed tower's blocks are conditioned on (required then, else None)."""
        if (language is None) != (self.film_dim == 0):
            raise ValueError(f"a tower with film_dim={self.film_dim} takes "
                             + ("a language embedding" if self.film_dim else "no language embedding"))
        x = self.norm_pre(self._prefix_and_positions(self.patch_embed(pixels)))
        recompute = self.checkpointing and torch.is_grad_enabled()
        for block in self.blocks[: self.spec.blocks_run]:
            x = checkpoint(block, x, language, use_reentrant=False) if recompute else block(x, language)
        if self.spec.norm_features:
            x = self.norm(x)
        return x[:, self.spec.num_prefix_tokens :]


class VisionBackbone(nn.Module):
    """One or two towers (`featurizer`, `fused_featurizer`); several images per example.

    `pixel_values` [B, N*C, S, S] stacks N images on the channel axis, each with C = 3 * towers channels (the first
    three for the first tower). Features of the two towers are concatenated per patch; the patches of the N images
    follow each other (image 0 first), as in the official backbone. All images go through a tower in one batch.
    """

    def __init__(self, towers: list[ViTSpec], film_dim: int = 0):
        super().__init__()
        if len(towers) not in (1, 2) or len({(t.image_size, t.num_patches) for t in towers}) != 1:
            raise ValueError("the vision backbone takes one or two towers with the same image size and patch count")
        self.featurizer = ViT(towers[0], film_dim)
        self.fused_featurizer = ViT(towers[1], film_dim) if len(towers) == 2 else None
        self.embed_dim = sum(t.embed_dim for t in towers)
        self.channels_per_image = 3 * len(towers)
        self.patches_per_image = towers[0].num_patches

    def checkpointing_enable(self) -> None:
        """Store only each block's input in training and recompute the rest in the backward pass."""
        for tower in (self.featurizer, self.fused_featurizer):
            if tower is not None:
                tower.checkpointing = True

    def num_images(self, pixel_values: Tensor) -> int:
        channels = pixel_values.shape[1]
        if channels % self.channels_per_image:
            raise ValueError(f"pixel_values has {channels} channels; expected a multiple of {self.channels_per_image}"
                             " (3 per tower per image)")
        return channels // self.channels_per_image

    def forward(self, pixel_values: Tensor, language: Tensor | None = None) -> Tensor:
        """`language` [B, film_dim]: each example's average prompt embedding, for FiLMed towers (every image of an
        example is conditioned on it)."""
        batch, n = pixel_values.shape[0], self.num_images(pixel_values)
        images = pixel_values.unflatten(1, (n, self.channels_per_image)).flatten(0, 1)
        per_image = None if language is None else language.to(images.dtype).repeat_interleave(n, dim=0)
        features = self.featurizer(images[:, :3], per_image)
        if self.fused_featurizer is not None:
            features = torch.cat([features, self.fused_featurizer(images[:, 3:], per_image)], dim=2)
        return features.reshape(batch, n * features.shape[1], features.shape[2])

