"""A dataset's action and proprio statistics as `dataset_statistics.json` has them: OFT's, made in the model layer
(`models/oft/statistics.py`), which computes them for `PretrainedVLA.with_demonstrations`."""

from __future__ import annotations

from vla_scale.models.oft.statistics import dataset_statistics

__all__ = ["dataset_statistics"]
