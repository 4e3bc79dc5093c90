"""What an OFT policy is: the `OFTSpec`, read from an OpenVLA `config.json` (official or written by us).

An `OFTSpec` is all the model code reads, so every constant below comes from the spec, never from a literal in the
model code. A checkpoint's spec is read from its `config.json` (`spec_from_openvla`), the single source of truth; a
fresh policy's is made from the run's `model.*` keys above this package (`run_policy.spec_from_model_config`), and
`openvla_config` writes either back as the config.json that reads back to it. From a config.json:
  * vocabulary and action tokens: `text_config.vocab_size` is padded by `pad_to_multiple_of`; the official code takes
    `text_vocab = text_config.vocab_size - pad_to_multiple_of` (32000 for Llama-2) and the action tokens are its last
    `n_action_bins` ids; the stop token is `text_config.eos_token_id`.
  * towers: `timm_model_ids`, `image_sizes`, `timm_override_act_layers` (filled from `vision_backbone_id` as
    OpenVLAConfig does when absent).
  * Llama: `text_config`, with the transformers 4.40.1 `LlamaConfig` defaults (what the official code ran with) for
    every field the file leaves out.
  * chunk length, action and proprio size, normalisation, the number of camera images and the image pipeline: not
    config fields in the official code, which picks them per robot platform from the command line. We read them from
    our own `vla_scale` section when present, else from the platform the dataset names in `norm_stats` point to
    (LIBERO, ALOHA, BRIDGE), else they must be given.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

from vla_scale.models.oft.vision import ViTSpec, timm_vit_spec

LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
    "attention_dropout": 0.0,
}
"""transformers 4.40.1 LlamaConfig defaults: what an official `text_config` means by the fields it omits."""

PLATFORMS: dict[str, dict[str, Any]] = {
    "libero": {"chunk_len": 8, "action_dim": 7, "proprio_dim": 8, "normalization": "bounds_q99", "num_images": 2,
               "camera_resolution": 256},
    "aloha": {"chunk_len": 25, "action_dim": 14, "proprio_dim": 14, "normalization": "bounds", "num_images": 3,
              "camera_resolution": 0},
    "bridge": {"chunk_len": 5, "action_dim": 7, "proprio_dim": 7, "normalization": "bounds_q99", "num_images": 1,
               "camera_resolution": 0},
}
"""The official per-platform constants (prismatic/vla/constants.py) and evaluation defaults: images per example
(`num_images_in_input`: LIBERO third-person + wrist, ALOHA high + two wrists) and the side the official evaluation
renders its cameras at before resizing to the model's input (LIBERO `env_img_res=256`; 0: not fixed)."""

OFFICIAL_EVALUATION: dict[str, Any] = {"image_resize": "jpeg_lanczos3", "center_crop": True}
"""What the official OpenVLA-OFT evaluation does to camera images before the checkpoint's processor (which only
normalises): the JPEG round trip + Lanczos-3 resize of `resize_image_for_policy`, and `center_crop=True` (its
default, "important" for checkpoints trained with random crops). `PretrainedVLA` applies it to folders that do not
say otherwise (ours record both in their `vla_scale` section)."""

IMAGE_RESIZES = ("bicubic", "jpeg_lanczos3")
"""How camera images reach the towers' size: torch's antialiased bicubic, or the official OpenVLA(-OFT) evaluation's
JPEG round trip + Lanczos-3 with antialias (`envs/official_images.py`), what its RLDS training images went through."""

VISION_BACKBONES: dict[str, tuple[list[str], int, list[str | None]]] = {
    "clip-vit-l": (["vit_large_patch14_clip_224.openai"], 224, ["quick_gelu"]),
    "clip-vit-l-336px": (["vit_large_patch14_clip_336.openai"], 336, ["quick_gelu"]),
    "dinov2-vit-l": (["vit_large_patch14_reg4_dinov2.lvd142m"], 224, [None]),
    "in1k-vit-l": (["vit_large_patch16_224.augreg_in21k_ft_in1k"], 224, [None]),
    "siglip-vit-so400m": (["vit_so400m_patch14_siglip_224"], 224, [None]),
    "siglip-vit-so400m-384px": (["vit_so400m_patch14_siglip_384"], 384, [None]),
    "dinoclip-vit-l-336px": (["vit_large_patch14_reg4_dinov2.lvd142m", "vit_large_patch14_clip_336.openai"], 336,
                             [None, "quick_gelu"]),
    "dinosiglip-vit-so-224px": (["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"], 224,
                                [None, None]),
    "dinosiglip-vit-so-384px": (["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_384"], 384,
                                [None, None]),
}
"""OpenVLAConfig's vision_backbone_id -> (timm ids, image size, activation overrides)."""

ATTENTION_MODES = ("bidirectional", "causal")
ACTION_CONVENTIONS = ("env", "openvla")
"""Whose convention a policy's un-normalised actions are in (envs/simulator.py): the env's own (policies trained
here, by RL from scratch or by SFT on the env's demonstrations) or OpenVLA's (official fine-tunes)."""
ACTION_HEADS = ("tokens", "l1")
"""What reads actions off the backbone (models/oft/action_heads.py; `model.action_head=auto` resolves to one)."""


@dataclass
class OFTSpec:
    """The resolved architecture and decode constants of one policy."""

    towers: list[ViTSpec]
    llm: dict[str, Any]  # complete LlamaConfig kwargs
    pad_to_multiple_of: int
    n_bins: int
    chunk_len: int
    action_dim: int
    proprio_dim: int  # 0: no proprio projector
    normalization: str
    attention: str = "bidirectional"
    learned_action_queries: bool = False
    ordinal_bin_init: float = 0.0
    center_crop: bool = False
    unnorm_key: str = ""
    num_images: int = 1  # camera images per example, primary first
    image_resize: str = "bicubic"  # IMAGE_RESIZES
    camera_resolution: int = 0  # the side the evaluation pipeline renders at (0: any)
    use_proprio: bool = True  # feed the proprio token (False: the official discrete path, which drops it)
    action_head: str = "tokens"  # models/oft/action_heads.HEADS: the LM head's bins, or the L1-regression MLP
    log_std_init: float = -1.0  # the l1 head's Gaussian: initial log-std per action dimension
    action_convention: str = ""  # ACTION_CONVENTIONS; "": OpenVLA's when the policy has statistics, else the env's
    use_film: bool = False  # FiLM: the towers' blocks conditioned on the prompt's average embedding (OFT+)
    norm_stats: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)  # official config.json fields kept for saving (the file read)

    @property
    def text_vocab(self) -> int:
        return int(self.llm["vocab_size"]) - self.pad_to_multiple_of

    @property
    def action_token_begin(self) -> int:
        return self.text_vocab - self.n_bins

    @property
    def stop_token_id(self) -> int:
        return int(self.llm["eos_token_id"])

    @property
    def pad_token_id(self) -> int:
        return int(self.llm["pad_token_id"])

    @property
    def num_action_tokens(self) -> int:
        return self.chunk_len * self.action_dim

    @property
    def resolved_convention(self) -> str:
        """The convention of the policy's actions: as saved, else OpenVLA's for a folder with statistics (an
        official fine-tune), else the env's."""
        return self.action_convention or ("openvla" if self.norm_stats else "env")


def llm_kwargs(text_config: dict[str, Any], pad_token_id: int) -> dict[str, Any]:
    """The Llama fields of a `text_config`, with `LLAMA_DEFAULTS` for those it omits."""
    if text_config.get("model_type", "llama") != "llama":
        raise ValueError(f"only Llama backbones are supported, not {text_config.get('model_type')!r}")
    llm = {key: text_config.get(key, default) for key, default in LLAMA_DEFAULTS.items()}
    if llm["pad_token_id"] is None:
        llm["pad_token_id"] = pad_token_id
    return llm


def timm_ids(config: dict[str, Any]) -> list[str]:
    """The timm towers an OpenVLAConfig names (explicitly, or through `vision_backbone_id`)."""
    ids = config.get("timm_model_ids") or VISION_BACKBONES.get(config.get("vision_backbone_id", ""), ([],))[0]
    fused = config.get("use_fused_vision_backbone", len(ids) == 2)
    return list(ids if fused else ids[:1])


def _towers(config: dict[str, Any], ours: dict[str, Any]) -> list[ViTSpec]:
    if "vision_towers" in ours:
        return [ViTSpec.from_dict(t) for t in ours["vision_towers"]]
    ids = timm_ids(config)
    if not ids:
        raise ValueError("config.json names no vision towers (timm_model_ids / vision_backbone_id)")
    _, default_size, default_acts = VISION_BACKBONES.get(config.get("vision_backbone_id", ""), ([], 224, []))
    sizes = config.get("image_sizes") or [default_size] * len(ids)
    acts = config.get("timm_override_act_layers") or default_acts or [None] * len(ids)
    return [timm_vit_spec(t, size, act) for t, size, act in zip(ids, sizes, acts, strict=False)]


def _platform(norm_stats: dict[str, Any]) -> dict[str, Any]:
    names = {p for key in norm_stats for p in PLATFORMS if p in key.lower()}
    return PLATFORMS[names.pop()] if len(names) == 1 else {}


def spec_from_openvla(config: dict[str, Any], proprio_dim: int | None = None, **overrides: Any) -> OFTSpec:
    """Read a config.json dict. `proprio_dim`: input size of the proprio projector found beside it (None: none).

    `overrides` replace any OFTSpec field (e.g. attention="causal", chunk_len=8, unnorm_key=...)."""
    ours = config.get("vla_scale", {})
    norm_stats = config.get("norm_stats") or {}
    platform = _platform(norm_stats)
    constants: dict[str, Any] = {}
    # OFT's recipes train the extra cameras and the proprio projector together (LIBERO: --num_images_in_input 2
    # --use_proprio True); a checkpoint without a projector (e.g. SimpleVLA-RL's SFT ones) takes the primary image only
    images = platform.get("num_images", 1) if proprio_dim else 1
    inputs = {"num_images": images, "camera_resolution": platform.get("camera_resolution", 0),
              "image_resize": "bicubic", "center_crop": False}  # the model's own processor; see OFFICIAL_EVALUATION
    for key, default in inputs.items():
        constants[key] = overrides.pop(key, ours.get(key, default))
    for key in ("chunk_len", "action_dim", "normalization"):
        value = overrides.pop(key, ours.get(key, platform.get(key)))
        if value is None:
            raise ValueError(f"{key} is not in config.json and its norm_stats name no known robot platform "
                             f"({sorted(PLATFORMS)}): pass {key}=... to from_pretrained")
        constants[key] = value
    spec = OFTSpec(
        towers=_towers(config, ours),
        llm=llm_kwargs(config.get("text_config") or {}, int(config.get("pad_token_id", 32000))),
        pad_to_multiple_of=int(config.get("pad_to_multiple_of", 64)),
        n_bins=int(config.get("n_action_bins", 256)),
        proprio_dim=int(proprio_dim or 0),
        norm_stats=copy.deepcopy(norm_stats),
        raw=copy.deepcopy(config),
        **constants,
        **{k: ours[k] for k in ("attention", "learned_action_queries", "ordinal_bin_init", "unnorm_key",
                                "action_head", "log_std_init", "action_convention", "use_film") if k in ours},
    )
    spec = replace(spec, **overrides)
    check_spec(spec)
    return spec


def check_spec(spec: OFTSpec) -> None:
    """A spec's enumerated fields are among their choices and its sizes agree, else ValueError."""
    if spec.attention not in ATTENTION_MODES:
        raise ValueError(f"attention={spec.attention!r}: choose one of {ATTENTION_MODES}")
    if spec.image_resize not in IMAGE_RESIZES:
        raise ValueError(f"image_resize={spec.image_resize!r}: choose one of {IMAGE_RESIZES}")
    if spec.action_head not in ACTION_HEADS:
        raise ValueError(f"action_head={spec.action_head!r}: choose one of {ACTION_HEADS}")
    if spec.action_convention not in ("", *ACTION_CONVENTIONS):
        raise ValueError(f"action_convention={spec.action_convention!r}: choose one of {ACTION_CONVENTIONS}")
    if spec.num_images < 1:
        raise ValueError(f"num_images={spec.num_images} must be >= 1")
    if spec.action_token_begin < 0:
        raise ValueError(f"vocabulary {spec.llm['vocab_size']} too small for {spec.n_bins} action bins")
    for name, stats in spec.norm_stats.items():
        dim = len(stats["action"]["q01"])
        if dim != spec.action_dim:
            raise ValueError(f"norm_stats[{name!r}] has {dim}-d actions but the policy decodes {spec.action_dim}")


def openvla_config(spec: OFTSpec) -> dict[str, Any]:
    """The config.json to save: the official fields (kept from the file read, or made up) plus our section."""
    config = copy.deepcopy(spec.raw)
    text_config = dict(config.get("text_config") or {})
    text_config.update({k: v for k, v in spec.llm.items() if v != LLAMA_DEFAULTS.get(k, object())})
    text_config.setdefault("model_type", "llama")
    config.update(text_config=text_config, n_action_bins=spec.n_bins, pad_to_multiple_of=spec.pad_to_multiple_of,
                  norm_stats=spec.norm_stats, pad_token_id=spec.pad_token_id,
                  use_fused_vision_backbone=len(spec.towers) == 2,
                  image_sizes=[t.image_size for t in spec.towers])
    config["vla_scale"] = {
        "chunk_len": spec.chunk_len, "action_dim": spec.action_dim, "normalization": spec.normalization,
        "attention": spec.attention, "learned_action_queries": spec.learned_action_queries,
        "ordinal_bin_init": spec.ordinal_bin_init, "center_crop": spec.center_crop, "unnorm_key": spec.unnorm_key,
        "num_images": spec.num_images, "image_resize": spec.image_resize, "camera_resolution": spec.camera_resolution,
        "action_head": spec.action_head, "log_std_init": spec.log_std_init,
        "action_convention": spec.action_convention, "vision_towers": [t.to_dict() for t in spec.towers],
        "use_film": spec.use_film,
    }
    return config
