"""OpenVLA-OFT's record in the family registry: its keys are `model.*` themselves (the schema's), its translation
is `run_policy`'s, its folders are told by their OpenVLA config.json (`models/families.py`)."""

from vla_scale.models.family import PolicyFamily

FAMILY = PolicyFamily(name="oft", title="OpenVLA-OFT", run="vla_scale.run_policy",
                      source="oft_vla_for_env", resolved="oft_resolved_model_config")
