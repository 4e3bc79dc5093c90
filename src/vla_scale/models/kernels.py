"""Which kernels run the policies' norms, gated MLPs and rotary embeddings (`model.kernels`): torch's eager ops, or
Liger Kernel's Triton kernels (`models/liger.py`).

`use_kernels(policy, "liger")` gives each module Liger has a kernel for the class of `models/liger.py` that replaces
its forward and nothing else: the parameters, their names and the module tree stay as they are, so checkpoints,
ZeRO-3's partitioning and hooks and the weight sync see the same policy. Liger is an optional dependency (the
`kernels` extra: `pip install -e '.[kernels]'`); `kernels_problem` says why a run cannot use it, before anything is
built. Nothing here imports torch or Liger until it is called.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

KERNELS = ("eager", "liger")
"""`model.kernels`: eager (torch's ops, every device) or liger (Liger Kernel's Triton kernels on a CUDA GPU)."""

LIGER_VERSION = "0.8.5"
"""The Liger Kernel release the `kernels` extra pins and the GPU parity tests ran."""


def kernels_problem(choice: str) -> str | None:
    """Why this process cannot run the policies with `choice` (None when it can): Liger's kernels need a CUDA GPU
    and the liger-kernel package."""
    if choice != "liger":
        return None
    import torch

    if not torch.cuda.is_available():
        return ("model.kernels=liger runs Liger Kernel's Triton kernels on a CUDA GPU and this machine has none: "
                "set model.kernels=eager")
    if importlib.util.find_spec("liger_kernel") is None:
        return (f"model.kernels=liger needs the liger-kernel package: pip install -e '.[kernels]' (liger-kernel=="
                f"{LIGER_VERSION}), or set model.kernels=eager")
    return None


def use_kernels(module: nn.Module, choice: str) -> nn.Module:
    """`module` (a policy, or any module holding the layers) with `choice`'s kernels, changed in place and returned;
    eager puts back the eager forward of any module swapped before (a benchmark compares both on one live policy).
    RuntimeError when `kernels_problem` names a reason."""
    if choice not in KERNELS:
        raise ValueError(f"model.kernels={choice!r}: choose one of {', '.join(KERNELS)}")
    if choice == "eager":
        liger = sys.modules.get("vla_scale.models.liger")  # nothing can have been swapped before it was imported
        if liger is not None:
            liger.swap_to_eager(module)
        return module
    problem = kernels_problem(choice)
    if problem:
        raise RuntimeError(problem)
    from vla_scale.models.liger import swap_to_liger

    swap_to_liger(module)
    return module
