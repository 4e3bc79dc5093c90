"""π0 and π0.5 (Physical Intelligence's flow-matching VLAs, as openpi's PyTorch code computes them): spec, model,
normalisation and tokenizer.

The names below resolve on first use (PEP 562): `spec` and `normalize` import without torch or transformers."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vla_scale.models.flow.normalize import FlowNormalizer, NormStats
    from vla_scale.models.pi0.policy import Pi0Inputs, Pi0Policy
    from vla_scale.models.pi0.spec import Pi0Spec
    from vla_scale.models.pi0.tokenizer import PaliGemmaTokenizer

_HOMES = {
    "NormStats": "normalize", "FlowNormalizer": "normalize", "Pi0Inputs": "policy", "Pi0Policy": "policy",
    "Pi0Spec": "spec", "PaliGemmaTokenizer": "tokenizer",
}

__all__ = ["NormStats", "PaliGemmaTokenizer", "Pi0Inputs", "FlowNormalizer", "Pi0Policy", "Pi0Spec"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'vla_scale.models.pi0' has no attribute {name!r}")
    return getattr(importlib.import_module(f"vla_scale.models.pi0.{_HOMES[name]}"), name)
