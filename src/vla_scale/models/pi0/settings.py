"""π0's and π0.5's own keys (`model.pi0.*`, read with model.family=pi0): the shape of a fresh policy, its tokenizer
and normalisation, and RL's stochastic chain (`models/flow/settings.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from vla_scale.models.flow.settings import FlowRLSettings


@dataclass
class Pi0ModelConfig(FlowRLSettings):
    """The π0 / π0.5 policy (model.family=pi0)."""

    preset: str = "pi0_tiny"
    """The π0 / π0.5 shape (models/pi0/spec.PRESETS): pi0, pi05 (openpi's 3.3B shapes) or pi0_tiny, pi05_tiny (CPU
    tests); the keys below replace its fields where set."""
    tokenizer: str = ""
    """The PaliGemma SentencePiece model file (`paligemma_tokenizer.model`, what openpi downloads; any SentencePiece
    model for tiny shapes, e.g. tests/fixtures/openpi_reference/tokenizer.model); required for model.family=pi0."""
    action_horizon: int = 0
    """Actions per chunk (0: the preset's; openpi: 50, LIBERO fine-tunes 10)."""
    action_dim: int = 0
    """The model's action and state size, a robot's zero-padded to it (0: the preset's; openpi: 32)."""
    max_token_len: int = 0
    """Prompt budget in tokens (0: the preset's; openpi: 48 for π0, 200 for π0.5)."""
    num_steps: int = 0
    """Euler steps of the denoising chain when sampling (0: the preset's, 10)."""
    image_size: int = 0
    """The SigLIP tower's image side in pixels; cameras are resized with padding to it (0: the preset's; openpi:
    224, pi0_tiny: 28)."""
    patch_size: int = 0
    """The SigLIP tower's patch side in pixels; image_size must be a multiple of it (0: the preset's; openpi: 14)."""
    normalization: str = ""
    """How states and actions are normalised: zscore, quantile or '' (the family's: z-score for π0, quantiles for
    π0.5)."""
    norm_convention: str = ""
    """Whose edge rules the normalisation follows: openpi (1e-6 added to every divisor and multiplied back),
    lerobot (LeRobot's processor: 1e-8 added to the std, to q99 - q01 only where it is 0, float32) or '' (the
    checkpoint's: lerobot for a LeRobot-layout folder, openpi otherwise)."""

    BOUNDS: ClassVar[dict[str, tuple[str, float, bool]]] = {
        **FlowRLSettings.BOUNDS, **{k: (">= 0", 0, True) for k in ("action_horizon", "action_dim", "max_token_len",
                                                                   "num_steps", "image_size", "patch_size")}}

    @staticmethod
    def choices() -> dict[str, tuple[Any, ...]]:
        from vla_scale.models.pi0.spec import NORM_CONVENTIONS, NORMALIZATIONS, PRESETS

        return {**FlowRLSettings.choices(), "preset": tuple(PRESETS), "normalization": ("", *NORMALIZATIONS),
                "norm_convention": ("", *NORM_CONVENTIONS)}
