"""π0's record in the family registry: `model.pi0.*`, its translation (`run.py`), LeRobot's `pi0` / `pi05` folders."""

from vla_scale.models.family import PolicyFamily
from vla_scale.models.pi0.settings import Pi0ModelConfig

FAMILY = PolicyFamily(name="pi0", title="π0", run="vla_scale.models.pi0.run", settings=Pi0ModelConfig,
                      lerobot_types={"pi0": "pi0", "pi05": "pi05"}, lerobot_weights="paligemma_with_expert.",
                      variants={"pi05": "π0.5"})
