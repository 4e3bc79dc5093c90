"""The OFT policy (native OpenVLA-OFT), its processor, its tokenizers and checkpoint loading."""

from vla_scale.models.actions import ActionTokenizer, DatasetStats
from vla_scale.models.policy import OFTPolicy
from vla_scale.models.pretrained import CheckpointError, Prediction, PretrainedVLA
from vla_scale.models.processor import ImageTransform, PolicyInputs, PreparedInputs, Processor
from vla_scale.models.tokenizer import HFTokenizer, TextTokenizer, WordTokenizer

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
