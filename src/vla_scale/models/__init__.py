"""The OFT policy (native OpenVLA-OFT), its processor, its tokenizers and checkpoint loading.

The names below resolve on first use (PEP 562), so a light module of the package (`spec`, `lora`) imports without
building the Llama stack: the configuration's checks read their choices from them."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vla_scale.models.actions import ActionTokenizer, DatasetStats
    from vla_scale.models.oft.policy import OFTPolicy
    from vla_scale.models.pretrained import CheckpointError, Prediction, PretrainedVLA
    from vla_scale.models.processor import ImageTransform, PolicyInputs, PreparedInputs, Processor
    from vla_scale.models.tokenizer import HFTokenizer, TextTokenizer, WordTokenizer

_HOMES = {
    "ActionTokenizer": "actions", "DatasetStats": "actions", "OFTPolicy": "oft.policy", "CheckpointError": "pretrained",
    "Prediction": "pretrained", "PretrainedVLA": "pretrained", "ImageTransform": "processor",
    "PolicyInputs": "processor", "PreparedInputs": "processor", "Processor": "processor",
    "HFTokenizer": "tokenizer", "TextTokenizer": "tokenizer", "WordTokenizer": "tokenizer",
}

__all__ = [
    "ActionTokenizer",
    "CheckpointError",
    "DatasetStats",
    "HFTokenizer",
    "ImageTransform",
    "OFTPolicy",
    "PolicyInputs",
    "PreparedInputs",
    "Prediction",
    "PretrainedVLA",
    "Processor",
    "TextTokenizer",
    "WordTokenizer",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'vla_scale.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"vla_scale.models.{_HOMES[name]}"), name)
