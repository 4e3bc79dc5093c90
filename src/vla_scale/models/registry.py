"""The policy families by name: each folder of `models/` describes itself in its `family.py` (`PolicyFamily`), this
registry lists them, and everything else asks it (`policy_family(name)`).

Adding a family: its folder (docs/ARCHITECTURE.md, "Adding a family"), its model configs (`configs/model/`) and one
entry in `FAMILIES` below. Nothing here imports torch or the config machinery.
"""

from __future__ import annotations

from vla_scale.models.family import PolicyFamily
from vla_scale.models.oft import family as oft
from vla_scale.models.pi0 import family as pi0
from vla_scale.models.smolvla import family as smolvla

FAMILIES: dict[str, PolicyFamily] = {record.name: record for record in (oft.FAMILY, pi0.FAMILY, smolvla.FAMILY)}


def policy_family(name: str) -> PolicyFamily:
    """The record of the family `model.family` names."""
    if name not in FAMILIES:
        raise ValueError(f"model.family={name!r} is not a known policy family; choose one of {sorted(FAMILIES)}")
    return FAMILIES[name]


def checkpoint_titles() -> dict[str, str]:
    """Every checkpoint variant of every family -> its title (`pi05` -> π0.5)."""
    return {variant: title for record in FAMILIES.values() for variant, title in record.titles().items()}


def run_family(variant: str) -> str:
    """The `model.family` that loads a checkpoint variant (π0.5 is π0's family with its flags)."""
    return next(record.name for record in FAMILIES.values() if variant in record.titles())
