"""Trainer checkpoints: the DeepSpeed engine (weights + optimizer), consolidated safetensors weights, RNG states.

Layout: `<run_dir>/checkpoints/step_<k>/` holds DeepSpeed's files plus `model.safetensors`; `<run_dir>/checkpoints/
latest` names the newest complete step. The trainer state (step, policy version, sampler and RNG states) travels as
DeepSpeed's client state.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from vla_scale.parallel.weight_sync import gathered_buckets


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def checkpoint_root(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def latest_tag(run_dir: str) -> str | None:
    path = os.path.join(checkpoint_root(run_dir), "latest")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read().strip()


def save_weights(module: torch.nn.Module, path: str, bucket_mb: float, write: bool) -> None:
    """Consolidated weights as safetensors (gathered bucket by bucket; only the writing rank keeps copies)."""
    tensors: dict[str, torch.Tensor] = {}
    for bucket in gathered_buckets(module, bucket_mb):
        if write:
            tensors.update((name, t.detach().cpu().clone()) for name, t in bucket)
    if write:
        save_file(tensors, path)


def mark_latest(run_dir: str, tag: str) -> None:
    tmp = os.path.join(checkpoint_root(run_dir), "latest.tmp")
    with open(tmp, "w") as f:
        f.write(tag)
    os.replace(tmp, os.path.join(checkpoint_root(run_dir), "latest"))
