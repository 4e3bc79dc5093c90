"""SmolVLA's own keys (`model.smolvla.*`, read with model.family=smolvla): the shape of a fresh policy, its tokenizer,
how many actions of a chunk the env plays, and RL's stochastic chain (`models/flow/settings.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from vla_scale.models.flow.settings import FlowRLSettings


@dataclass
class SmolVLAModelConfig(FlowRLSettings):
    """The SmolVLA policy (model.family=smolvla): LeRobot's small VLA, a SmolVLM cut to its first layers and a
    flow-matching action expert."""

    preset: str = "smolvla_tiny"
    """The shape (models/smolvla/spec.PRESETS): smolvla (LeRobot's SmolVLA on SmolVLM2-500M-Video-Instruct, 450M
    parameters) or smolvla_tiny (CPU tests); the keys below replace its fields where set."""
    tokenizer: str = ""
    """A folder holding the VLM's tokenizer.json and tokenizer_config.json (SmolVLM2's; a LeRobot SmolVLA folder
    carries them in its tokenizer/ and is read from there when this is ''); required for a fresh policy."""
    chunk_size: int = 0
    """Actions per chunk (0: the preset's; LeRobot: 50)."""
    n_action_steps: int = 0
    """Actions of each chunk the env plays before the policy decodes again (0: a checkpoint's own, else the whole
    chunk; LeRobot's n_action_steps)."""
    max_state_dim: int = 0
    """The model's state width, a robot's zero-padded to it (0: the preset's; LeRobot: 32)."""
    max_action_dim: int = 0
    """The model's action width, a robot's zero-padded to it (0: the preset's; LeRobot: 32)."""
    num_steps: int = 0
    """Euler steps of the denoising chain when sampling (0: the preset's, 10)."""
    tokenizer_max_length: int = 0
    """Prompt budget in tokens (0: the preset's; LeRobot: 48)."""
    image_size: int = 0
    """The side cameras are resized to with padding before the vision tower (0: the preset's; LeRobot: 512; a
    multiple of the tower's patch times the connector's scale factor)."""

    BOUNDS: ClassVar[dict[str, tuple[str, float, bool]]] = {
        **FlowRLSettings.BOUNDS, **{k: (">= 0", 0, True) for k in (
            "chunk_size", "n_action_steps", "max_state_dim", "max_action_dim", "num_steps", "tokenizer_max_length",
            "image_size")}}

    @staticmethod
    def choices() -> dict[str, tuple[Any, ...]]:
        from vla_scale.models.smolvla.spec import PRESETS

        return {**FlowRLSettings.choices(), "preset": tuple(PRESETS)}
