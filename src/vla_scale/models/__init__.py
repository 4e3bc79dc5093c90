"""The OFT policy (native OpenVLA-OFT), its processor, its tokenizers and checkpoint loading."""

from vla_scale.models.actions import ActionTokenizer, DatasetStats
from vla_scale.models.policy import OFTPolicy, build_policy
from vla_scale.models.processor import ImageTransform, PolicyInputs, Processor
from vla_scale.models.tokenizer import TextTokenizer, WordTokenizer

__all__ = [
    "ActionTokenizer",
    "DatasetStats",
    "ImageTransform",
    "OFTPolicy",
    "PolicyInputs",
    "Processor",
    "TextTokenizer",
    "WordTokenizer",
    "build_policy",
]
