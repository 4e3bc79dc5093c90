"""What a π0 or π0.5 policy is: the `Pi0Spec`, its presets, and the config.json that describes one.

openpi's `Pi0Config` names two Gemma variants (`gemma_2b` for PaliGemma's language model, `gemma_300m` for the action
expert) and hard-codes PaliGemma's SigLIP So400m/14 tower at 224 px; here every shape is a field, so tiny policies
for CPU tests are the same code. The two Gemmas attend jointly, layer by layer, over one sequence: they must agree
on depth, heads, key/value heads and head size (only width and MLP size differ), and PaliGemma's projector maps
the tower's width to PaliGemma's.

π0 and π0.5 differ in two places (`pi05`): π0 feeds the normalised state as one continuous token at the head of the
expert's suffix and mixes the flow time into the action tokens by an MLP; π0.5 writes the discretised state into the
prompt (`models/pi0/tokenizer.py`) and conditions every RMS norm of the expert on the time (adaRMS). openpi also
normalises them differently: z-scores for π0, quantiles to [-1, 1] for π0.5 (`models/flow/normalize.py`).

This module imports neither torch nor transformers (the configuration's checks may read it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from vla_scale.models.flow.normalize import NORM_CONVENTIONS, NORMALIZATIONS

PALIGEMMA_VOCAB = 257_152
"""PaliGemma's vocabulary (Gemma's 256k + 1024 location + 128 segmentation tokens), openpi's `PALIGEMMA_VOCAB_SIZE`."""



@dataclass(frozen=True)
class GemmaSpec:
    """One Gemma decoder (openpi's `gemma.Config`): width, layers, MLP size, query heads, key/value heads, head size."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0


@dataclass(frozen=True)
class SiglipSpec:
    """The SigLIP vision tower (transformers' `SiglipVisionConfig` fields that change the weights)."""

    image_size: int = 224
    patch_size: int = 14
    width: int = 1152
    depth: int = 27
    mlp_dim: int = 4304
    num_heads: int = 16
    layer_norm_eps: float = 1e-6

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


GEMMA_VARIANTS: dict[str, GemmaSpec] = {
    "gemma_2b": GemmaSpec(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_300m": GemmaSpec(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
    "dummy": GemmaSpec(width=64, depth=4, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16),
}
"""openpi's `gemma.get_config` variants by name (LoRA variants have the same shapes)."""


@dataclass(frozen=True)
class Pi0Spec:
    """The resolved shapes and flags of one π0 / π0.5 policy; all the model code reads."""

    paligemma: GemmaSpec
    expert: GemmaSpec
    vision: SiglipSpec = field(default_factory=SiglipSpec)
    pi05: bool = False
    action_dim: int = 32  # the model's (padded) action and state size; a robot's are zero-padded to it
    action_horizon: int = 50
    max_token_len: int = 48  # prompt budget in tokens (openpi: 48 for π0, 200 for π0.5)
    vocab_size: int = PALIGEMMA_VOCAB
    num_images: int = 3  # camera slots (openpi: base, left wrist, right wrist); a missing camera is masked
    num_steps: int = 10  # Euler steps of `sample_actions` from t = 1 to t = 0
    normalization: str = ""  # NORMALIZATIONS; "": openpi's for the family (z-score π0, quantile π0.5)
    norm_convention: str = ""  # NORM_CONVENTIONS; "": openpi's (a LeRobot folder is read as lerobot)
    discrete_state_input: bool | None = None  # state in the prompt; None: as `pi05` (openpi's pi05_libero: False)

    @property
    def resolved_normalization(self) -> str:
        return self.normalization or ("quantile" if self.pi05 else "zscore")

    @property
    def resolved_norm_convention(self) -> str:
        return self.norm_convention or "openpi"

    @property
    def state_in_prompt(self) -> bool:
        return self.pi05 if self.discrete_state_input is None else self.discrete_state_input

    @property
    def tokens_per_image(self) -> int:
        return self.vision.num_patches

    @property
    def prefix_len(self) -> int:
        return self.num_images * self.tokens_per_image + self.max_token_len

    @property
    def suffix_len(self) -> int:
        """The expert's tokens: π0's state token, then one per action step."""
        return self.action_horizon + (0 if self.pi05 else 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Pi0Spec:
        d = dict(d)
        d["paligemma"], d["expert"] = GemmaSpec(**d["paligemma"]), GemmaSpec(**d["expert"])
        d["vision"] = SiglipSpec(**d.get("vision", {}))
        return cls(**d)


def check_spec(spec: Pi0Spec) -> None:
    """The two Gemmas can attend jointly and every size is positive, else ValueError naming the fields."""
    shared = ("depth", "num_heads", "num_kv_heads", "head_dim")
    differ = [f"{k} ({getattr(spec.paligemma, k)} vs {getattr(spec.expert, k)})" for k in shared
              if getattr(spec.paligemma, k) != getattr(spec.expert, k)]
    if differ:
        raise ValueError("PaliGemma and the action expert attend jointly per layer and must agree on "
                         + ", ".join(differ))
    if spec.paligemma.num_heads % spec.paligemma.num_kv_heads:
        raise ValueError(f"num_heads={spec.paligemma.num_heads} is not a multiple of "
                         f"num_kv_heads={spec.paligemma.num_kv_heads}")
    if spec.normalization not in ("", *NORMALIZATIONS):
        raise ValueError(f"normalization={spec.normalization!r}: choose one of {NORMALIZATIONS}")
    if spec.norm_convention not in ("", *NORM_CONVENTIONS):
        raise ValueError(f"norm_convention={spec.norm_convention!r}: choose one of {NORM_CONVENTIONS}")
    if spec.vision.image_size % spec.vision.patch_size or spec.vision.width % spec.vision.num_heads:
        raise ValueError(f"vision tower: image_size {spec.vision.image_size} must be a multiple of patch_size "
                         f"{spec.vision.patch_size} and width {spec.vision.width} of num_heads {spec.vision.num_heads}")
    sizes = {"action_dim": spec.action_dim, "action_horizon": spec.action_horizon, "num_steps": spec.num_steps,
             "max_token_len": spec.max_token_len, "num_images": spec.num_images, "vocab_size": spec.vocab_size}
    bad = [f"{k}={v}" for k, v in sizes.items() if v < 1]
    if bad:
        raise ValueError("must be >= 1: " + ", ".join(bad))


def pi0_spec(pi05: bool = False, **overrides: Any) -> Pi0Spec:
    """openpi's `Pi0Config()` / `Pi0Config(pi05=True)`: PaliGemma 2B (SigLIP So400m/14 at 224 px, Gemma 2B) and the
    300M Gemma expert, 32-d actions over 50 steps, 48 (π0) or 200 (π0.5) prompt tokens."""
    spec = Pi0Spec(paligemma=GEMMA_VARIANTS["gemma_2b"], expert=GEMMA_VARIANTS["gemma_300m"], pi05=pi05,
                   max_token_len=200 if pi05 else 48)
    spec = replace(spec, **overrides)
    check_spec(spec)
    return spec


TINY_VISION = SiglipSpec(image_size=28, patch_size=14, width=32, depth=2, mlp_dim=64, num_heads=4)


def tiny_spec(pi05: bool = False, **overrides: Any) -> Pi0Spec:
    """A π0 / π0.5 small enough for CPU tests: 2 layers of 8 heads of 16 (one key/value head, as openpi's Gemmas),
    4 patches per 28 px image, a 512-token vocabulary, 8-d actions over 4 steps."""
    spec = Pi0Spec(
        paligemma=GemmaSpec(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16),
        expert=GemmaSpec(width=32, depth=2, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=16),
        vision=TINY_VISION, pi05=pi05, action_dim=8, action_horizon=4, max_token_len=24 if pi05 else 12,
        vocab_size=512, num_images=3, num_steps=10,
    )
    spec = replace(spec, **overrides)
    check_spec(spec)
    return spec


PRESETS = {"pi0": lambda: pi0_spec(False), "pi05": lambda: pi0_spec(True),
           "pi0_tiny": lambda: tiny_spec(False), "pi05_tiny": lambda: tiny_spec(True)}
"""The shapes `model=pi0`, `model=pi05` and their tiny CPU versions will name."""


def spec_from_openpi(config: dict[str, Any], pi05: bool | None = None, **overrides: Any) -> Pi0Spec:
    """The spec of an openpi config.json: what its JAX -> PyTorch conversion writes (`paligemma_variant`,
    `action_expert_variant`, `action_dim`, `action_horizon`; it does not say π0 or π0.5, so `pi05` comes from the
    caller, who can tell by the weights' names) or a fuller one that spells the shapes out (`paligemma`,
    `action_expert`: gemma.Config fields; `vision`: SigLIP config fields; `gemma_common`; `pi05`, `vocab_size`,
    `max_token_len`, `num_steps`, `image_keys`), as the parity fixture's does. `overrides` replace any field."""
    openpi = config.get("openpi_config", {})

    def gemma(shapes: str, variant: str, default: str) -> GemmaSpec:
        common = {k: v for k, v in config.get("gemma_common", {}).items() if k in ("rms_norm_eps", "rope_theta")}
        if shapes in config:
            return GemmaSpec(**{k: config[shapes][k] for k in ("width", "depth", "mlp_dim", "num_heads",
                                                               "num_kv_heads", "head_dim")}, **common)
        name = config.get(variant, openpi.get(variant, default)).removesuffix("_lora")
        if name not in GEMMA_VARIANTS:
            raise ValueError(f"{variant}={name!r}: known are {sorted(GEMMA_VARIANTS)}")
        return replace(GEMMA_VARIANTS[name], **common)

    vision = SiglipSpec()
    if "vision" in config:
        v = config["vision"]
        if v.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh" or v.get("vision_use_head"):
            raise ValueError("the SigLIP tower must use tanh-approximated GELU and no pooling head")
        vision = SiglipSpec(image_size=v["image_size"], patch_size=v["patch_size"], width=v["hidden_size"],
                            depth=v["num_hidden_layers"], mlp_dim=v["intermediate_size"],
                            num_heads=v["num_attention_heads"], layer_norm_eps=v.get("layer_norm_eps", 1e-6))
    is_pi05 = bool(config.get("pi05", openpi.get("pi05", False))) if pi05 is None else pi05
    fields: dict[str, Any] = {
        "paligemma": gemma("paligemma", "paligemma_variant", "gemma_2b"),
        "expert": gemma("action_expert", "action_expert_variant", "gemma_300m"),
        "vision": vision, "pi05": is_pi05,
        "action_dim": config.get("action_dim", openpi.get("action_dim", 32)),
        "action_horizon": config.get("action_horizon", openpi.get("action_horizon", 50)),
        "max_token_len": config.get("max_token_len") or openpi.get("max_token_len") or (200 if is_pi05 else 48),
        "vocab_size": config.get("vocab_size", PALIGEMMA_VOCAB),
        "num_images": len(config.get("image_keys", ())) or 3,
        "num_steps": config.get("num_steps", 10),
        "discrete_state_input": config.get("discrete_state_input", openpi.get("discrete_state_input")),
    }
    spec = replace(Pi0Spec(**fields), **overrides)
    check_spec(spec)
    return spec
