"""What every family's checkpoint folders share: a training run's step folders, and copying named tensors into a
policy's parameters (gathered and set on rank 0 under ZeRO-3)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

RUN_CHECKPOINTS, LATEST = "checkpoints", "latest"
"""A training run directory keeps its step folders in `checkpoints/`; `checkpoints/latest` names the newest complete
one (`vla_scale.checkpoint` writes them)."""


def step_folder(path: str) -> str:
    """The checkpoint folder `path` stands for: a training run directory its newest complete step folder (each one
    is a checkpoint folder of this layout), anything else itself."""
    latest = os.path.join(path, RUN_CHECKPOINTS, LATEST)
    if not os.path.isdir(os.path.join(path, RUN_CHECKPOINTS)):
        return path
    if not os.path.isfile(latest):
        raise FileNotFoundError(f"{path} is a run directory that saved no checkpoint ({latest} is missing): pass a run "
                                "that did, or one of its checkpoints/step_<k> folders")
    with open(latest) as f:
        return os.path.join(path, RUN_CHECKPOINTS, f.read().strip())


def copy_tensors(module: torch.nn.Module, tensors: Iterator[tuple[str, torch.Tensor]], zero3: bool,
                 fresh: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> None:
    """Copy named tensors into `module`'s parameters; raise naming what is missing (but the names of `optional` and
    the parameters whose names start with one of `fresh`, which keep their init), unexpected or misshaped."""
    params = dict(module.named_parameters())
    seen: set[str] = set()
    for name, tensor in tensors:
        if name not in params:
            raise KeyError(f"checkpoint tensor {name!r} has no parameter in the policy (architecture mismatch)")
        _copy_one(name, params[name], tensor, zero3)
        seen.add(name)
    missing = sorted(n for n in set(params) - seen - set(optional) if not n.startswith(fresh))
    if missing:
        raise KeyError(f"checkpoint lacks {len(missing)} parameters of the policy, e.g. {missing[:5]}")


def _copy_one(name: str, param: torch.nn.Parameter, tensor: torch.Tensor, zero3: bool) -> None:
    shape = tuple(getattr(param, "ds_shape", param.shape)) if zero3 else tuple(param.shape)
    if shape != tuple(tensor.shape):
        raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != policy shape {shape}")
    if not zero3:
        with torch.no_grad():
            param.copy_(tensor)
        return
    import deepspeed
    import torch.distributed as dist

    with deepspeed.zero.GatheredParameters([param], modifier_rank=0), torch.no_grad():
        if not dist.is_initialized() or dist.get_rank() == 0:
            param.copy_(tensor)
