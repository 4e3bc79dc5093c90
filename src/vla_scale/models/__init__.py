"""The OFT policy, its processor and its tokenizers."""

from vla_scale.models.policy import OFTPolicy, PolicyInputs, Processor, build_policy
from vla_scale.models.tokenizer import ActionTokenizer, TextTokenizer, WordTokenizer

__all__ = [
    "ActionTokenizer",
    "OFTPolicy",
    "PolicyInputs",
    "Processor",
    "TextTokenizer",
    "WordTokenizer",
    "build_policy",
]
