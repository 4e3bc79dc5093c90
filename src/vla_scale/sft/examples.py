"""Demonstrations -> what the policy trains on: each family builds its own (`models/interface.Demonstrations`; OFT's
in `models/oft/demonstrations.py`, π0's in `models/pi0/demonstrations.py`). The names SFT code and its tests use are
kept here."""

from __future__ import annotations

from vla_scale.models.interface import draw_batches
from vla_scale.models.oft.demonstrations import SupervisedExamples, TokenBatch, chunk_targets

__all__ = ["SupervisedExamples", "TokenBatch", "chunk_targets", "draw_batches"]
