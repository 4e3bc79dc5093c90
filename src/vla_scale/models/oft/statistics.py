"""A dataset's action and proprio statistics in the layout of OpenVLA's `dataset_statistics.json`.

The policy normalises with them at run time (`models/oft/actions.DatasetStats`: q01/q99 for BOUNDS_Q99), so SFT computes
them from its demonstrations and saves them in the checkpoint folder; the RL run and the evaluation read them back
from there. Quantiles as numpy's default (linear) interpolation, over every step of every episode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def _summary(values: np.ndarray) -> dict[str, list[float] | list[bool]]:
    """mean, std, max, min, q01, q99 per dimension of float [N, D], and the mask (every dimension normalised)."""
    v = values.astype(np.float64)
    return {"mean": v.mean(0).tolist(), "std": v.std(0).tolist(), "max": v.max(0).tolist(), "min": v.min(0).tolist(),
            "q01": np.quantile(v, 0.01, axis=0).tolist(), "q99": np.quantile(v, 0.99, axis=0).tolist(),
            "mask": [True] * v.shape[1]}


def dataset_statistics(actions: Sequence[np.ndarray], states: Sequence[np.ndarray]) -> dict[str, Any]:
    """One dataset's entry of `norm_stats` from its episodes' actions [T, A] and proprio states [T, P]."""
    if not actions:
        raise ValueError("no episodes to compute statistics from")
    return {"action": _summary(np.concatenate(actions)), "proprio": _summary(np.concatenate(states)),
            "num_transitions": int(sum(len(a) for a in actions)), "num_trajectories": len(actions)}
