"""The actor: the trainable policy inside a DeepSpeed engine (ZeRO stage from config).

Under `python launch/train.py` this is a world of one process (gloo on CPU); under `deepspeed`/`torchrun` every rank
holds its ZeRO shard. With ZeRO-3 the policy is built under `deepspeed.zero.Init`, so no rank materialises the
whole model; weight sync and checkpoints gather parameters explicitly (`parallel/weight_sync.py`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import deepspeed
import torch
import torch.distributed as dist

from vla_scale.algo import clipped_policy_loss, logprobs_from_logits, token_entropy
from vla_scale.config import AlgoConfig, DeepSpeedConfig
from vla_scale.models.policy import OFTPolicy, PolicyInputs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed() -> tuple[int, int]:
    """Join (or, without a launcher, create) the process group; returns (rank, world size)."""
    if not dist.is_initialized():
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(key, value)
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
    return dist.get_rank(), dist.get_world_size()


def deepspeed_config(ds: DeepSpeedConfig, algo: AlgoConfig) -> dict[str, Any]:
    """The DeepSpeed JSON config for the actor."""
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.offload_optimizer and ds.zero_stage > 0:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if ds.zero_stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": algo.micro_batches,
        "gradient_clipping": algo.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": ds.bf16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class Actor:
    """Recomputes log-probs and applies the GRPO update through DeepSpeed."""

    def __init__(self, build: Callable[[bool], OFTPolicy], ds: DeepSpeedConfig, algo: AlgoConfig):
        """`build(zero3_init)` constructs the policy; it is called inside `deepspeed.zero.Init` for ZeRO-3."""
        self.algo = algo
        self.ds_config = deepspeed_config(ds, algo)
        if ds.zero_stage == 3:
            with deepspeed.zero.Init(config_dict_or_path=self.ds_config):
                policy = build(True)
        else:
            policy = build(False)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=algo.lr, weight_decay=algo.weight_decay)
        self.engine, *_ = deepspeed.initialize(model=policy, optimizer=optimizer, config=self.ds_config)
        self.zero_stage = ds.zero_stage

    @property
    def policy(self) -> OFTPolicy:
        return self.engine.module

    @property
    def device(self) -> torch.device:
        return self.engine.device

    def update(self, micro_batches: list[tuple[PolicyInputs, torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict:
        """One optimizer step over micro-batches of (inputs, tokens, old log-probs, advantages).

        The loss is the token mean over the whole mini-batch: each micro-batch's mean is weighted by its share of
        rows (all rows carry the same number of action tokens). DeepSpeed divides by its accumulation steps, which
        equal the number of micro-batches, so the weight is multiplied back by it.
        """
        assert len(micro_batches) == self.ds_config["gradient_accumulation_steps"]
        self.engine.train()
        rows = sum(len(mb[0]) for mb in micro_batches)
        stats: dict[str, float] = {"policy_loss": 0.0, "clip_frac": 0.0, "entropy": 0.0, "approx_kl": 0.0}
        for inputs, tokens, old_logprobs, advantages in micro_batches:
            share = len(inputs) / rows
            logits = self.engine(inputs.to(self.device))
            logprobs = logprobs_from_logits(logits, tokens.to(self.device), self.algo.temperature)
            loss, info = clipped_policy_loss(
                logprobs, old_logprobs.to(self.device), advantages.to(self.device),
                torch.ones_like(logprobs, dtype=torch.bool), self.algo.clip_low, self.algo.clip_high,
            )
            self.engine.backward(loss * share * len(micro_batches))
            self.engine.step()
            with torch.no_grad():
                entropy = token_entropy(logits.detach() / self.algo.temperature).mean().item()
            stats["policy_loss"] += loss.item() * share
            stats["clip_frac"] += info["clip_frac"] * share
            stats["approx_kl"] += info["approx_kl"] * share
            stats["entropy"] += entropy * share
        stats["grad_norm"] = float(self.engine.get_global_grad_norm() or 0.0)
        return stats

    def save(self, directory: str, tag: str, client_state: dict) -> None:
        self.engine.save_checkpoint(directory, tag=tag, client_state=client_state)

    def load(self, directory: str, tag: str) -> dict:
        path, client_state = self.engine.load_checkpoint(directory, tag=tag)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint {tag!r} under {directory}")
        return client_state
