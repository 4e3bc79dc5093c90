"""The actor: the trainable policy inside a DeepSpeed engine (ZeRO stage from config).

Under `python launch/train.py` this is a world of one process (gloo on CPU); under `deepspeed`/`torchrun` every rank
holds its ZeRO shard. With ZeRO-3 the policy is built under `deepspeed.zero.Init`, so no rank materialises the
whole model; weight sync and checkpoints gather parameters explicitly (`sync/weight_sync.py`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.utils import set_z3_leaf_modules
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from vla_scale.algo import clipped_policy_loss, logprobs_from_logits, token_entropy
from vla_scale.config import AlgoConfig, DeepSpeedConfig
from vla_scale.models.policy import OFTPolicy, PolicyInputs
from vla_scale.models.vision import Block


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
        if torch.cuda.is_available():  # before anything is allocated (zero.Init builds on the current device)
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
    return dist.get_rank(), dist.get_world_size()


def deepspeed_config(ds: DeepSpeedConfig, algo: AlgoConfig) -> dict[str, Any]:
    """The DeepSpeed JSON config for the actor."""
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.offload_optimizer and ds.zero_stage > 0:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if ds.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if ds.zero_stage == 3:
        zero["stage3_param_persistence_threshold"] = ds.param_persistence_threshold
        zero["stage3_prefetch_bucket_size"] = ds.prefetch_bucket_size
        zero["stage3_max_live_parameters"] = ds.max_live_parameters
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


class OptimizerStates:
    """The tensors a ZeRO optimizer keeps beside the working weights: the inner optimizer's state (Adam moments) and
    the fp32 master partitions it steps. `offload` moves them to (reused, pinned) host buffers; `reload` back."""

    def __init__(self, zero_optimizer: Any, device: torch.device):
        self.inner = zero_optimizer.optimizer  # the torch optimizer over the fp32 partitions
        # ZeRO-3 hands its fp32 partitions to the inner optimizer only for the duration of a step
        self.masters: list[torch.Tensor] = list(getattr(zero_optimizer, "fp32_partitioned_groups_flat", []))
        self.device = device
        self.host: dict[int, torch.Tensor] = {}

    def _tensors(self) -> list[tuple[Any, Any]]:
        """(holder, key) of every tensor to move: state dict entries and master partitions (by their `.data`)."""
        found: list[tuple[Any, Any]] = [(master, "data") for master in self.masters]
        for state in self.inner.state.values():
            found.extend((state, key) for key, value in state.items() if torch.is_tensor(value) and value.dim())
        return found

    @staticmethod
    def _get(holder: Any, key: Any) -> torch.Tensor:
        return holder.data if key == "data" else holder[key]

    @staticmethod
    def _set(holder: Any, key: Any, value: torch.Tensor) -> None:
        if key == "data":
            holder.data = value
        else:
            holder[key] = value

    def offload(self) -> None:
        pin = self.device.type == "cuda"
        for i, (holder, key) in enumerate(self._tensors()):
            tensor = self._get(holder, key)
            host = self.host.get(i)
            if host is None or host.shape != tensor.shape or host.dtype != tensor.dtype:
                host = self.host[i] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
            host.copy_(tensor, non_blocking=pin)
            self._set(holder, key, host)
        if pin:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def reload(self) -> None:
        for i, (holder, key) in enumerate(self._tensors()):
            self._set(holder, key, self.host[i].to(self.device, non_blocking=True))
        if self.device.type == "cuda":
            torch.cuda.synchronize()


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
        if ds.activation_checkpointing:
            lm = policy.language_model  # transformers renamed it in 5.x; older images have only the first name
            enable = getattr(lm, "activation_checkpointing_enable", None) or lm.gradient_checkpointing_enable
            enable({"use_reentrant": False})
            policy.vision_backbone.checkpointing_enable()
        if ds.leaf_modules:
            set_z3_leaf_modules(policy, [LlamaDecoderLayer, Block])
        # With the optimizer state on GPUs, torch's fused AdamW: one pass over the fp32 master weights and moments per
        # step instead of one per arithmetic operation (docs/performance.md).
        fused = torch.cuda.is_available() and not ds.offload_optimizer
        optimizer = torch.optim.AdamW(policy.parameters(), lr=algo.lr, weight_decay=algo.weight_decay,
                                      fused=fused or None)
        self.engine, *_ = deepspeed.initialize(model=policy, optimizer=optimizer, config=self.ds_config)
        self.zero_stage = ds.zero_stage
        self.states_offloaded = False
        self._state_holder: OptimizerStates | None = None  # built on the first offload (ZeRO-3 only)

    @property
    def policy(self) -> OFTPolicy:
        return self.engine.module

    @property
    def device(self) -> torch.device:
        return self.engine.device

    def update(self, micro_batches: list[tuple[PolicyInputs, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                               torch.Tensor]]) -> dict:
        """One optimizer step over micro-batches of (inputs, tokens, old log-probs, advantages, token mask, token
        weights).

        The weights (`algo.token_weights` of the whole mini-batch) make each micro-batch's loss its share of the
        mini-batch's loss, whatever the split. DeepSpeed divides by its accumulation steps, which equal the number of
        micro-batches, so each loss is multiplied back by it. Metrics are weighted by each micro-batch's valid tokens.
        """
        assert len(micro_batches) == self.ds_config["gradient_accumulation_steps"]
        self.engine.train()
        tokens_total = max(sum(int(mb[4].sum()) for mb in micro_batches), 1)
        stats: dict[str, float] = {"policy_loss": 0.0, "clip_frac": 0.0, "entropy": 0.0, "approx_kl": 0.0}
        for index, (inputs, tokens, old_logprobs, advantages, mask, weights) in enumerate(micro_batches):
            share = int(mask.sum()) / tokens_total
            logits = self.engine(inputs.to(self.device))
            logprobs = logprobs_from_logits(logits, tokens.to(self.device), self.algo.temperature)
            mask = mask.to(self.device)
            loss, info = clipped_policy_loss(
                logprobs, old_logprobs.to(self.device), advantages.to(self.device), mask, self.algo.clip_low,
                self.algo.clip_high, weights.to(self.device),
            )
            if index == 0:  # computed before this update's optimizer step: the rollout <-> actor mismatch
                stats.update({f"mismatch_{k}": info[k] for k in ("abs_log_ratio", "approx_kl", "outside_clip")})
            self.engine.backward(loss * len(micro_batches))
            self.engine.step()
            with torch.no_grad():
                entropy = token_entropy(logits.detach() / self.algo.temperature)[mask].mean().nan_to_num().item()
            stats["policy_loss"] += loss.item()
            stats["clip_frac"] += info["clip_frac"] * share
            stats["approx_kl"] += info["approx_kl"] * share
            stats["entropy"] += entropy * share
        stats["grad_norm"] = float(self.engine.get_global_grad_norm() or 0.0)
        return stats

    @torch.no_grad()
    def logprobs(self, inputs: PolicyInputs, tokens: torch.Tensor) -> torch.Tensor:
        """The actor's log-probs of `tokens` at the sampling temperature (no gradient), float32 on the CPU: the old
        log-probs of `algo.old_logprobs=recompute`. Every rank must call it equally often (ZeRO-3 gathers)."""
        logits = self.engine(inputs.to(self.device))
        return logprobs_from_logits(logits, tokens.to(self.device), self.algo.temperature).float().cpu()

    def offload_states(self) -> None:
        """Move the optimizer's moments and fp32 master weights to CPU memory until `reload_states` (ZeRO-3).

        Only the working weights' shard (what weight sync gathers) stays on the device. Pinned host buffers are
        allocated on the first offload and reused. DeepSpeed's own `offload_states` requires its fused CUDA Adam;
        this works for the plain torch optimizer the actor uses."""
        if not self.states_offloaded:
            if self._state_holder is None:
                self._state_holder = OptimizerStates(self.engine.optimizer, self.device)
            self._state_holder.offload()
            self.states_offloaded = True

    def reload_states(self) -> None:
        if self.states_offloaded and self._state_holder is not None:
            self._state_holder.reload()
            self.states_offloaded = False

    def save(self, directory: str, tag: str, client_state: dict) -> None:
        self.engine.save_checkpoint(directory, tag=tag, client_state=client_state)

    def load(self, directory: str, tag: str) -> dict:
        path, client_state = self.engine.load_checkpoint(directory, tag=tag)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint {tag!r} under {directory}")
        return client_state
