"""The supervised losses of fine-tuning on demonstrations, one per action head.

- tokens: cross-entropy over the `n_bins` bins of every action dimension of the chunk, at the action positions
  (OpenVLA-OFT's `finetune.py` with `--use_l1_regression False`: the discretised demonstration actions are the
  labels of the parallel-decoded action slots).
- l1: the mean absolute error between the L1-regression head's output and the normalised demonstration actions
  (OFT's `--use_l1_regression True`); the Gaussian's log-std that RL samples with is not a regression output and gets
  no gradient from it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

SUPERVISED_HEADS = ("tokens", "l1")


def token_cross_entropy(logits: Tensor, bins: Tensor) -> tuple[Tensor, dict[str, float]]:
    """Mean cross-entropy of `bins` (long [B, K], vocabulary-order bin indices) under `logits` (float [B, K, n_bins]),
    and the share of positions whose argmax bin is the label."""
    if bins.shape != logits.shape[:-1]:
        raise ValueError(f"labels {tuple(bins.shape)} must have the logits' shape {tuple(logits.shape[:-1])}")
    flat = logits.float().reshape(-1, logits.shape[-1])
    loss = F.cross_entropy(flat, bins.reshape(-1))
    with torch.no_grad():
        accuracy = (flat.argmax(-1) == bins.reshape(-1)).float().mean().item()
    return loss, {"token_accuracy": accuracy}


def l1_regression_loss(params: Tensor, targets: Tensor) -> tuple[Tensor, dict[str, float]]:
    """Mean |mean - target| of the l1 head's (mean, log-std) `params` [B, K, 2] against normalised `targets` [B, K]."""
    if targets.shape != params.shape[:-1]:
        raise ValueError(f"targets {tuple(targets.shape)} must have the head's shape {tuple(params.shape[:-1])}")
    loss = (params[..., 0].float() - targets.float()).abs().mean()
    return loss, {"l1": loss.item()}


def supervised_loss(params: Tensor, targets: Tensor, head: str) -> tuple[Tensor, dict[str, float]]:
    """The loss of `head` (SUPERVISED_HEADS) on what the policy's forward returned."""
    if head == "tokens":
        return token_cross_entropy(params, targets.long())
    if head == "l1":
        return l1_regression_loss(params, targets)
    raise ValueError(f"no supervised loss for action head {head!r}; choose one of {SUPERVISED_HEADS}")
