"""SmolVLA's record in the family registry: `model.smolvla.*`, its translation (`run.py`), LeRobot's `smolvla`
folders (weights under `model.vlm_with_expert.`)."""

from vla_scale.models.family import PolicyFamily
from vla_scale.models.smolvla.settings import SmolVLAModelConfig

FAMILY = PolicyFamily(name="smolvla", title="SmolVLA", run="vla_scale.models.smolvla.run", settings=SmolVLAModelConfig,
                      lerobot_types={"smolvla": "smolvla"}, lerobot_weights="vlm_with_expert.")
