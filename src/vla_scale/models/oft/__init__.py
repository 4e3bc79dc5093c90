"""OpenVLA-OFT as a family beside `models/pi0/`: its policy (a Llama backbone reading a whole action chunk per forward,
action bins or the L1 head), how the rollout engine decodes it (`decode.OFTDecoder`, with the engine's fast forward)
and how the actor scores its tokens again (`decode.OFTScorer`).

The names below resolve on first use (PEP 562), so a light module of the folder (`spec`) imports without building the
Llama stack: the configuration's checks read their choices from it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vla_scale.models.oft.actions import ActionTokenizer, DatasetStats
    from vla_scale.models.oft.policy import OFTPolicy
    from vla_scale.models.oft.pretrained import CheckpointError, Prediction, PretrainedVLA
    from vla_scale.models.oft.processor import ImageTransform, PolicyInputs, PreparedInputs, Processor

_HOMES = {
    "ActionTokenizer": "actions", "DatasetStats": "actions", "OFTPolicy": "policy", "CheckpointError": "pretrained",
    "Prediction": "pretrained", "PretrainedVLA": "pretrained", "ImageTransform": "processor",
    "PolicyInputs": "processor", "PreparedInputs": "processor", "Processor": "processor",
}

__all__ = [
    "ActionTokenizer",
    "CheckpointError",
    "DatasetStats",
    "ImageTransform",
    "OFTPolicy",
    "PolicyInputs",
    "PreparedInputs",
    "Prediction",
    "PretrainedVLA",
    "Processor",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'vla_scale.models.oft' has no attribute {name!r}")
    return getattr(importlib.import_module(f"vla_scale.models.oft.{_HOMES[name]}"), name)
