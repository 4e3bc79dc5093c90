"""What a SmolVLA policy is: the `SmolVLASpec`, its presets, and the LeRobot config.json that describes one.

SmolVLA (Hugging Face's flow-matching VLA, LeRobot's `smolvla` policy) is a SmolVLM (a SigLIP-like vision tower whose
patches a pixel shuffle folds into fewer, wider tokens, then a Llama decoder) cut to its first `num_vlm_layers`
layers, and an action expert: a narrower Llama (`expert_width_multiplier` of the VLM's width, the VLM's heads and
head size) that runs beside it layer by layer. In every `self_attn_every_n_layers`-th layer the expert's tokens join
the VLM's in one attention; in the others they attend only to the VLM's keys and values of that layer, which the
expert's own key and value projections map first (`attention_mode="cross_attn"`). LeRobot's `SmolVLAConfig` names
the VLM by hub id and reads its shapes from the VLM's config; here every shape is a field, so tiny policies for CPU
tests are the same code.

This module imports neither torch nor transformers (the configuration's checks may read it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

ATTENTION_MODES = ("self_attn", "cross_attn")
"""LeRobot's `attention_mode`: the expert always joins the VLM's attention, or only every n-th layer."""
SMOLVLM2_500M = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"
"""The VLM LeRobot's SmolVLA is built on (`vlm_model_name`'s default)."""


@dataclass(frozen=True)
class VisionSpec:
    """SmolVLM's vision tower (transformers' `SmolVLMVisionConfig` fields that change the weights); GELU tanh."""

    image_size: int = 512
    patch_size: int = 16
    width: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    layer_norm_eps: float = 1e-6


@dataclass(frozen=True)
class TextSpec:
    """SmolVLM's Llama decoder: widths, the VLM's full depth (`SmolVLASpec.num_vlm_layers` of it are kept), heads,
    vocabulary. `rope_theta` is what the layers rotate with: LeRobot's SmolVLA rotates with a fixed 10 000, whatever
    the VLM's config says (SmolVLM2's 100 000)."""

    width: int = 960
    depth: int = 32
    mlp_dim: int = 2560
    num_heads: int = 15
    num_kv_heads: int = 5
    head_dim: int = 64
    vocab_size: int = 49_280
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10_000.0
    tie_word_embeddings: bool = False


@dataclass(frozen=True)
class SmolVLASpec:
    """The resolved shapes and flags of one SmolVLA policy; all the model code reads. The names after `text` are
    LeRobot's `SmolVLAConfig` fields."""

    vision: VisionSpec = field(default_factory=VisionSpec)
    text: TextSpec = field(default_factory=TextSpec)
    scale_factor: int = 4  # the connector's pixel shuffle: scale_factor^2 patches become one token
    num_vlm_layers: int = 16
    num_expert_layers: int = -1  # <= 0: as many as the VLM's kept layers; else a divisor of them
    expert_width_multiplier: float = 0.75
    self_attn_every_n_layers: int = 2
    attention_mode: str = "cross_attn"
    chunk_size: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    num_steps: int = 10
    tokenizer_max_length: int = 48
    resize_imgs_with_padding: tuple[int, int] | None = (512, 512)  # (width, height), as LeRobot writes it
    num_images: int = 3  # camera slots; a missing camera is masked
    add_image_special_tokens: bool = False  # image tokens between <fake_token_around_image> <global-img> and one more
    fake_image_token_id: int = -1  # the tokenizer's ids of those two tokens (needed only with the special tokens)
    global_image_token_id: int = -1
    prefix_length: int = -1  # > 0: the prefix is right-padded to this many tokens
    min_period: float = 4e-3
    max_period: float = 4.0

    @property
    def action_horizon(self) -> int:
        return self.chunk_size

    @property
    def action_dim(self) -> int:
        return self.max_action_dim

    @property
    def expert_width(self) -> int:
        return int(self.text.width * self.expert_width_multiplier)

    @property
    def expert_mlp_dim(self) -> int:
        """LeRobot's expert MLP size: 4 * (2/3 of the width), rounded up to a multiple of 256."""
        hidden = 4 * int(2 * self.expert_width / 3)
        return 256 * -(-hidden // 256)

    @property
    def expert_depth(self) -> int:
        return self.num_expert_layers if self.num_expert_layers > 0 else self.num_vlm_layers

    @property
    def image_size(self) -> int:
        """The side of the square images the tower reads (the resize target, else the tower's own size)."""
        return self.resize_imgs_with_padding[1] if self.resize_imgs_with_padding else self.vision.image_size

    @property
    def tokens_per_image(self) -> int:
        patches = (self.image_size // self.vision.patch_size) ** 2
        return patches // self.scale_factor**2 + (3 if self.add_image_special_tokens else 0)

    @property
    def prefix_len(self) -> int:
        """Images, prompt and the state token (padded to `prefix_length` when that is longer)."""
        return max(self.num_images * self.tokens_per_image + self.tokenizer_max_length + 1, self.prefix_length)

    @property
    def kv_width(self) -> int:
        """The width of one token's keys (or values) over the key/value heads: what a cross layer's k/v read."""
        return self.text.num_kv_heads * self.text.head_dim

    def cross_layer(self, layer: int) -> bool:
        """Whether the expert only attends to the VLM's keys and values in this layer (else it joins the attention).
        Of an expert layer's index: whether its key and value projections read the VLM's keys (LeRobot shapes them
        by the expert's index, and runs them by the VLM's)."""
        every = self.self_attn_every_n_layers
        return "cross" in self.attention_mode and not (every > 0 and layer % every == 0)

    def expert_layer(self, layer: int) -> int | None:
        """The expert layer that runs beside VLM layer `layer`, None where the expert has fewer layers and skips."""
        stride = self.num_vlm_layers // self.expert_depth
        return None if layer % stride else layer // stride

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SmolVLASpec:
        d = dict(d)
        d["vision"], d["text"] = VisionSpec(**d.get("vision", {})), TextSpec(**d.get("text", {}))
        if d.get("resize_imgs_with_padding") is not None:
            d["resize_imgs_with_padding"] = tuple(d["resize_imgs_with_padding"])
        return cls(**d)


def check_spec(spec: SmolVLASpec) -> None:
    """Every shape fits the layers that read it, else ValueError naming the field."""
    problems = [*_size_problems(spec), *_head_problems(spec), *_layout_problems(spec)]
    if problems:
        raise ValueError("SmolVLA spec: " + "; ".join(problems))


def _size_problems(spec: SmolVLASpec) -> list[str]:
    sizes = {"chunk_size": spec.chunk_size, "max_state_dim": spec.max_state_dim, "num_steps": spec.num_steps,
             "max_action_dim": spec.max_action_dim, "tokenizer_max_length": spec.tokenizer_max_length,
             "num_images": spec.num_images, "num_vlm_layers": spec.num_vlm_layers, "scale_factor": spec.scale_factor,
             "text.vocab_size": spec.text.vocab_size, "vision.depth": spec.vision.depth}
    return [f"{k}={v} must be >= 1" for k, v in sizes.items() if v < 1]


def _head_problems(spec: SmolVLASpec) -> list[str]:
    text, vision = spec.text, spec.vision
    found = []
    if vision.width % vision.num_heads:
        found.append(f"vision.width={vision.width} is not a multiple of vision.num_heads={vision.num_heads}")
    if text.num_heads % text.num_kv_heads:
        found.append(f"text.num_heads={text.num_heads} is not a multiple of text.num_kv_heads={text.num_kv_heads}")
    if text.head_dim % 2:
        found.append(f"text.head_dim={text.head_dim} must be even (rotary halves)")
    if spec.expert_width < 2 or spec.expert_width % 2:
        found.append(f"expert_width_multiplier={spec.expert_width_multiplier} gives an expert width of "
                     f"{spec.expert_width}: the time embedding needs an even width")
    return found


def _layout_problems(spec: SmolVLASpec) -> list[str]:
    found = []
    if spec.attention_mode not in ATTENTION_MODES:
        found.append(f"attention_mode={spec.attention_mode!r}: choose one of {ATTENTION_MODES}")
    if not 1 <= spec.num_vlm_layers <= spec.text.depth:
        found.append(f"num_vlm_layers={spec.num_vlm_layers} must be in [1, text.depth={spec.text.depth}]")
    if spec.num_vlm_layers % spec.expert_depth:
        found.append(f"num_expert_layers={spec.num_expert_layers} must divide num_vlm_layers={spec.num_vlm_layers}")
    elif any(spec.cross_layer(i) != spec.cross_layer(j) for i in range(spec.num_vlm_layers)
             if (j := spec.expert_layer(i)) is not None):
        found.append(f"num_expert_layers={spec.num_expert_layers}: an expert layer whose key/value projections read "
                     "the VLM's keys would run in a joint layer (or the reverse)")
    size = spec.resize_imgs_with_padding
    if size is not None and size[0] != size[1]:
        found.append(f"resize_imgs_with_padding={size} must be square (the connector folds a square grid)")
    if spec.image_size % (spec.vision.patch_size * spec.scale_factor):
        found.append(f"the image side {spec.image_size} must be a multiple of vision.patch_size * scale_factor = "
                     f"{spec.vision.patch_size * spec.scale_factor}")
    if spec.add_image_special_tokens and min(spec.fake_image_token_id, spec.global_image_token_id) < 0:
        found.append("add_image_special_tokens needs fake_image_token_id and global_image_token_id")
    return found


def smolvla_spec(**overrides: Any) -> SmolVLASpec:
    """LeRobot's default `SmolVLAConfig()` on SmolVLM2-500M-Video-Instruct (its config.json's shapes): a 512 px
    SigLIP-B/16 tower (64 tokens per image after the 4x4 pixel shuffle), the first 16 of the 32 layers of a 960-wide
    Llama (15 heads, 5 key/value heads of 64), a 720-wide expert of 16 layers crossing to the VLM in every other
    layer, 32-d state and actions, 50 actions per chunk, 10 Euler steps, 48 prompt tokens."""
    spec = replace(SmolVLASpec(), **overrides)
    check_spec(spec)
    return spec


def tiny_spec(**overrides: Any) -> SmolVLASpec:
    """A SmolVLA small enough for CPU tests (a few hundred thousand parameters): 32 px images of 8 px patches (4
    tokens per image after the 2x2 shuffle), 4 VLM layers of 4 heads (2 key/value heads) of 8, a 24-wide expert
    crossing every other layer, 8-d state and actions (every shipped simulator's fit), chunks of 4, 4 Euler steps,
    a 512-token vocabulary (room for a small test tokenizer, e.g. the parity fixture's 388)."""
    spec = SmolVLASpec(
        vision=VisionSpec(image_size=32, patch_size=8, width=32, depth=2, num_heads=4, mlp_dim=64),
        text=TextSpec(width=32, depth=4, mlp_dim=64, num_heads=4, num_kv_heads=2, head_dim=8, vocab_size=512),
        scale_factor=2, num_vlm_layers=4, chunk_size=4, max_state_dim=8, max_action_dim=8, num_steps=4,
        tokenizer_max_length=48, resize_imgs_with_padding=(32, 32), num_images=2,
    )
    spec = replace(spec, **overrides)
    check_spec(spec)
    return spec


PRESETS = {"smolvla": smolvla_spec, "smolvla_tiny": tiny_spec}
"""The shapes `model=smolvla` and its tiny CPU version will name."""


def spec_from_lerobot(config: dict[str, Any], vlm_config: dict[str, Any] | None = None,
                      **overrides: Any) -> SmolVLASpec:
    """The spec of a LeRobot SmolVLA policy's config.json (`type: smolvla`) and of its VLM's config.json (what LeRobot
    reads through `vlm_model_name`; None: SmolVLM2-500M-Video-Instruct's shapes, refused for another VLM).
    `overrides` replace any field (with `add_image_special_tokens`, the tokenizer's two ids, which no config holds)."""
    if config.get("type", "smolvla") != "smolvla":
        raise ValueError(f"config.json says type={config.get('type')!r}, not a SmolVLA policy")
    if vlm_config is None:
        name = config.get("vlm_model_name", SMOLVLM2_500M)
        if name != SMOLVLM2_500M:
            raise ValueError(f"vlm_model_name={name!r}: pass that VLM's config.json (its shapes are not known here)")
        vision, text, scale = VisionSpec(), TextSpec(), 4
    else:
        vision, text, scale = _vision(vlm_config), _text(vlm_config), int(vlm_config.get("scale_factor", 4))
    keys = [k for k in SmolVLASpec.__dataclass_fields__ if k not in ("vision", "text", "scale_factor", "num_images")]
    fields: dict[str, Any] = {k: config[k] for k in keys if config.get(k) is not None}
    if "resize_imgs_with_padding" in fields:
        fields["resize_imgs_with_padding"] = tuple(fields["resize_imgs_with_padding"])
    elif "resize_imgs_with_padding" in config:
        fields["resize_imgs_with_padding"] = None
    if config.get("num_vlm_layers", 16) <= 0:
        fields["num_vlm_layers"] = text.depth
    features = config.get("input_features", {})
    cameras = sum(1 for f in features.values() if f.get("type") == "VISUAL") + config.get("empty_cameras", 0)
    spec = SmolVLASpec(vision=vision, text=text, scale_factor=scale, num_images=cameras or 1, **fields)
    spec = replace(spec, **overrides)
    check_spec(spec)
    return spec


def _vision(vlm_config: dict[str, Any]) -> VisionSpec:
    v = vlm_config.get("vision_config", {})
    if v.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ValueError(f"vision_config.hidden_act={v['hidden_act']!r}: the tower uses tanh-approximated GELU")
    base = VisionSpec()
    return VisionSpec(image_size=v.get("image_size", base.image_size), patch_size=v.get("patch_size", base.patch_size),
                      width=v.get("hidden_size", base.width), depth=v.get("num_hidden_layers", base.depth),
                      num_heads=v.get("num_attention_heads", base.num_heads),
                      mlp_dim=v.get("intermediate_size", base.mlp_dim),
                      layer_norm_eps=v.get("layer_norm_eps", base.layer_norm_eps))


def _text(vlm_config: dict[str, Any]) -> TextSpec:
    t = vlm_config.get("text_config", {})
    odd = {k: t[k] for k in ("hidden_act", "attention_bias", "mlp_bias") if k in t}
    if odd.get("hidden_act", "silu") != "silu" or odd.get("attention_bias") or odd.get("mlp_bias"):
        raise ValueError(f"text_config {odd}: the decoder must be Llama's (SiLU MLP, no biases)")
    base = TextSpec()
    width, heads = t.get("hidden_size", base.width), t.get("num_attention_heads", base.num_heads)
    tie = vlm_config.get("tie_word_embeddings", t.get("tie_word_embeddings", base.tie_word_embeddings))
    return TextSpec(width=width, depth=t.get("num_hidden_layers", base.depth),
                    mlp_dim=t.get("intermediate_size", base.mlp_dim), num_heads=heads,
                    num_kv_heads=t.get("num_key_value_heads", heads), head_dim=t.get("head_dim") or width // heads,
                    vocab_size=t.get("vocab_size", base.vocab_size),
                    rms_norm_eps=t.get("rms_norm_eps", base.rms_norm_eps), tie_word_embeddings=bool(tie))
