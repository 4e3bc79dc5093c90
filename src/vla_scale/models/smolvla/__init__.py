"""SmolVLA (Hugging Face's flow-matching VLA, as LeRobot's code computes it): spec, image preprocessing and model.

The names below resolve on first use (PEP 562): `spec` imports without torch or transformers."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vla_scale.models.smolvla.policy import SmolVLAPolicy
    from vla_scale.models.smolvla.spec import SmolVLASpec

_HOMES = {"SmolVLAPolicy": "policy", "SmolVLASpec": "spec"}

__all__ = ["SmolVLAPolicy", "SmolVLASpec"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'vla_scale.models.smolvla' has no attribute {name!r}")
    return getattr(importlib.import_module(f"vla_scale.models.smolvla.{_HOMES[name]}"), name)
