"""Flow-Noise's noise head for π0 / π0.5: the shared one (`models/flow/noise_head.py`), under its old import path.

π0's checkpoint folders keep it in `noise_head.safetensors` beside openpi's `model.safetensors`
(`models/pi0/checkpoint.py`), which openpi and LeRobot load as it is."""

from __future__ import annotations

from vla_scale.models.flow.noise_head import FILE, HIDDEN, PREFIX, STD_BOUNDS, NoiseHead

__all__ = ["FILE", "HIDDEN", "PREFIX", "STD_BOUNDS", "NoiseHead"]
