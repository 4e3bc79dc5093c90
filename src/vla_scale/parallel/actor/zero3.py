"""The actor: the trainable policy (and a value head, when the algorithm needs values) inside a DeepSpeed engine (ZeRO
stage from config), its RL update in micro-batches, and the supervised step of fine-tuning on demonstrations.

Under `python launch/train.py` this is a world of one process (gloo on CPU); under `deepspeed`/`torchrun` every rank
holds its ZeRO shard. With ZeRO-3 the policy is built under `deepspeed.zero.Init`, so no rank materialises the
whole model; weight sync and checkpoints gather parameters explicitly (`parallel/sync/weight_sync.py`).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from vla_scale.algo.base import Algorithm
from vla_scale.algo.registry import make_algorithm
from vla_scale.batches import MicroBatch, MiniBatch, UpdatePlan
from vla_scale.config import AlgoConfig, DeepSpeedConfig, LoraConfig, SftConfig
from vla_scale.models.checkpoint_folders import copy_tensors
from vla_scale.models.critic import PolicyWithValue, ValueHead, read_value_head, value_head_file
from vla_scale.models.fp8_update import use_update_precision
from vla_scale.models.interface import ChunkScorer, SupervisedBatch
from vla_scale.models.lora import add_adapters
from vla_scale.objectives import clipped_policy_loss, logprob_mismatch, truncated_is_weights
from vla_scale.parallel.actor.optimizer_states import OptimizerStates, StatesStream, stream_states_through_step
from vla_scale.parallel.ranks import mean_over_ranks

REDUCE_BUCKET_SIZE = 500_000_000
"""DeepSpeed's default gradient reduce bucket, in elements."""


Training = AlgoConfig | SftConfig
"""What the actor's optimizer and accumulation read (lr, weight_decay, grad_clip, micro_batches): RL's algorithm or
supervised fine-tuning's settings."""


def deepspeed_config(ds: DeepSpeedConfig, algo: Training) -> dict[str, Any]:
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
        zero["sub_group_size"] = ds.sub_group_size
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


@dataclass(frozen=True)
class Mismatch:
    """How far the rollout's log-probs are from the actor's before the update, over the valid tokens
    (`algo.logprob_mismatch`): mean |log ratio|, the k3 KL estimate, the share of ratios outside the clip range, and
    the behaviour weights' (the ratios') spread: standard deviation, largest, share above `algo.tis_cap`."""

    abs_log_ratio: float = 0.0
    approx_kl: float = 0.0
    outside_clip: float = 0.0
    weight_std: float = 0.0
    weight_max: float = 0.0
    truncated: float = 0.0


@dataclass(frozen=True)
class UpdateResult:
    """One RL update: the optimizer steps' mean loss, clip fraction, entropy, approx KL and gradient norm (each
    optimizer step's token-weighted over its micro-batches), the rollout <-> actor mismatch, the samples trained on,
    the seconds the proximal pass (old log-probs, values) took and the algorithm's own measures (`algorithm`: what
    it made and what its loss terms measured)."""

    policy_loss: float
    clip_frac: float
    entropy: float
    approx_kl: float
    grad_norm: float
    mismatch: Mismatch
    samples: int
    recompute_s: float = 0.0
    algorithm: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """The `train/` scalars of the update (TensorBoard names without the prefix)."""
        return {"policy_loss": self.policy_loss, "clip_frac": self.clip_frac, "entropy": self.entropy,
                "approx_kl": self.approx_kl, "grad_norm": self.grad_norm,
                **{f"mismatch_{k}": v for k, v in vars(self.mismatch).items()}, "samples": float(self.samples),
                **self.algorithm}


@dataclass
class _StepStats:
    """One optimizer step's metrics and the old log-probs its loss used, per micro-batch (float32, host)."""

    policy_loss: float = 0.0
    clip_frac: float = 0.0
    entropy: float = 0.0
    approx_kl: float = 0.0
    grad_norm: float = 0.0
    terms: dict[str, float] = field(default_factory=dict)
    """The algorithm's loss terms' measures, summed over the micro-batches."""
    first_mismatch: Mismatch = field(default_factory=Mismatch)
    old: list[torch.Tensor] = field(default_factory=list)

    @staticmethod
    def means(steps: list[_StepStats]) -> dict[str, float]:
        """Each metric's mean over the steps, summed in step order."""
        means = dict.fromkeys(("policy_loss", "clip_frac", "entropy", "approx_kl", "grad_norm"), 0.0)
        for step in steps:
            for key in means:
                means[key] += getattr(step, key) / len(steps)
        return means

    @staticmethod
    def term_means(steps: list[_StepStats]) -> dict[str, float]:
        """Each loss term's measure, its mean over the steps."""
        return {key: sum(step.terms[key] for step in steps) / len(steps) for key in steps[0].terms}


@dataclass
class _Proximal:
    """What the actor gives a mini-batch's micro-batches before the update: the old log-probs (None: the update
    forward's own, detached) and, with a value head, the values."""

    old: list[torch.Tensor | None]
    values: list[torch.Tensor] = field(default_factory=list)


class Actor:
    """The trainable policy in DeepSpeed: the RL update of an algorithm (`update`; `algo/base.Algorithm`), the
    supervised step, log-probs."""

    def __init__(self, build: Callable[[bool], nn.Module], ds: DeepSpeedConfig, algo: Training, *,
                 scorer: ChunkScorer, lora: LoraConfig | None = None, critic_from: str = ""):
        """`build(zero3_init)` constructs the policy; it is called inside `deepspeed.zero.Init` for ZeRO-3. With
        `lora.rank` > 0 the policy gets adapters and only they train (`models/lora.py`). With RL's settings the actor
        holds the algorithm `algo.name` names (`algorithm`; none for supervised fine-tuning); when it needs values a
        value head (`algo.critic.*`) trains beside the policy (beside the adapters with LoRA), its weights read from
        `critic_from`'s `value_head.safetensors` when that checkpoint folder has one, else fresh (`critic_source`
        says which).
        `scorer`: the family's way to score its recorded chunks again (`PolicySource.chunk_scorer()`; OFT: the head's
        distribution of the tokens; π0: the Flow-SDE chain's log-prob)."""
        import deepspeed  # seconds to import: only when an actor is built, after every check of the run
        from deepspeed.utils import set_z3_leaf_modules

        self.ds_config = deepspeed_config(ds, algo)
        adapt = lora is not None and lora.rank > 0
        self.algorithm = make_algorithm(algo) if isinstance(algo, AlgoConfig) else None
        critic = self.algorithm is not None and self.algorithm.needs_values
        if ds.zero_stage == 3:
            # zero.Init replaces torch.Tensor.__new__ while it is open, and torch._dynamo refuses to be imported
            # then (its polyfills check that function's signature): a model module whose imports pull it in
            # (transformers' masking utilities) must find it imported already.
            importlib.import_module("torch._dynamo")
        with deepspeed.zero.Init(config_dict_or_path=self.ds_config) if ds.zero_stage == 3 else nullcontext():
            policy = build(ds.zero_stage == 3)
            self.adapted = add_adapters(policy, lora) if adapt else []  # built as shards too
            head = self._value_head(policy, algo) if critic else None
        self.critic_source = self._load_value_head(head, critic_from, ds.zero_stage == 3) if head else ""
        if ds.activation_checkpointing:
            policy.activation_checkpointing_enable()
        if ds.leaf_modules and policy.zero3_leaf_types:
            set_z3_leaf_modules(policy, list(policy.zero3_leaf_types))
        # With the optimizer state on GPUs, torch's fused AdamW: one pass over the fp32 master weights and moments per
        # step instead of one per arithmetic operation (docs/performance.md).
        fused = torch.cuda.is_available() and not ds.offload_optimizer
        trained = [p for p in policy.parameters() if p.requires_grad]
        groups: list[dict[str, Any]] = [{"params": trained}]
        if head is not None:  # a group of its own: its learning rate, and the policy's alone set to 0 in warm-up
            groups.append({"params": list(head.parameters()), "lr": algo.critic.lr or algo.lr})
        optimizer = torch.optim.AdamW(groups, lr=algo.lr, weight_decay=algo.weight_decay, fused=fused or None)
        self._cap_reduce_bucket(sum(getattr(p, "ds_numel", p.numel()) for group in groups for p in group["params"]))
        module = policy if head is None else PolicyWithValue(policy, head)
        self.engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=self.ds_config)
        self.has_value_head = head is not None
        self.scorer = scorer
        self.zero_stage = ds.zero_stage
        self.checkpointing = ds.activation_checkpointing
        self.states_offloaded = False
        self._state_holder: OptimizerStates | None = None  # built on the first offload (ZeRO-3 only)
        self.streams_states = False
        self._states_stream: StatesStream | None = None  # built when the states first stream through the step
        self.configure(ds, algo)

    @staticmethod
    def _value_head(policy: nn.Module, algo: AlgoConfig) -> ValueHead:
        """A fresh value head on `policy`'s backbone (DeepSpeed gives it the engine's dtype, as the policy's)."""
        return ValueHead(policy.value_width, algo.critic.width, algo.critic.position)

    @staticmethod
    def _load_value_head(head: ValueHead, folder: str, zero3: bool) -> str:
        """`folder`'s value head copied into `head` when it has one; a sentence saying where the critic comes from."""
        if not folder or value_head_file(folder) is None:
            where = f"{folder} has no value head" if folder else "the policy is a fresh one"
            return f"critic: a fresh value head ({where})"
        tensors, _ = read_value_head(folder)
        copy_tensors(head, iter(tensors.items()), zero3)
        return f"critic: the value head of {folder}"

    def _cap_reduce_bucket(self, trained_numel: int) -> None:
        """A gradient reduce bucket no larger than the gradients it can hold: DeepSpeed allocates its bucket
        (`reduce_bucket_size` elements, 5e8 unless set) whole, 1.9 GiB in fp32 even for a model of a few thousand
        parameters; every model of 5e8 trained parameters or more keeps DeepSpeed's size."""
        zero = self.ds_config["zero_optimization"]
        zero["reduce_bucket_size"] = min(REDUCE_BUCKET_SIZE, max(trained_numel, 1))

    def configure(self, ds: DeepSpeedConfig, algo: Training) -> None:
        """The settings of how updates run that may change between updates: the loss's (`algo`), prompt trimming and
        whether the optimizer states stream through the step (turned on: they leave the GPU now; off: they come
        back), the precision of the blocks' matrix products (`deepspeed.update_precision`; `fp8_layers`: how many
        multiply in FP8), and with activation checkpointing how many Llama layers recompute. The DeepSpeed engine
        itself (ZeRO stage, precision, whether checkpointing is on) stays as it was built."""
        self.algo = algo
        if isinstance(algo, AlgoConfig):
            self.algorithm = self._same_needs(make_algorithm(algo))
        self.trim = ds.trim_prompt_padding
        self.fp8_layers = use_update_precision(self.policy, ds.update_precision, self.device, ds.bf16)
        if self.checkpointing:
            self._recompute_layers(ds.recompute_layers)
        if ds.stream_optimizer_states and not self.streams_states:
            self.offload_states()
            assert self._state_holder is not None
            if self._states_stream is None:
                self._states_stream = StatesStream(self._state_holder)
                stream_states_through_step(self.engine.optimizer, self._states_stream, lambda: self.streams_states)
        self.streams_states = ds.stream_optimizer_states
        if self._states_stream is not None:
            self._states_stream.resident = ds.resident_sub_groups
        if not self.streams_states:
            self.reload_states()

    def _same_needs(self, algorithm: Algorithm) -> Algorithm:
        """`algorithm`, when the engine was built for what it needs (a value head or none)."""
        if algorithm.needs_values != self.has_value_head:
            raise ValueError(f"algo.name={algorithm.name} needs {'a' if algorithm.needs_values else 'no'} value "
                             "head, and the actor was built otherwise: build a new actor for it")
        return algorithm

    def _recompute_layers(self, count: int) -> None:
        """The first `count` decoder layers recompute their forward in the backward pass, the rest keep their
        activations (-1: all recompute): the policy's `recompute_layers`."""
        self.policy.recompute_layers(count)

    @property
    def policy(self) -> nn.Module:
        """The policy alone (what weight sync, checkpoints' policy folders and the rollout engine see)."""
        return self.engine.module.policy if self.has_value_head else self.engine.module

    @property
    def value_head(self) -> ValueHead | None:
        return self.engine.module.value_head if self.has_value_head else None

    @property
    def device(self) -> torch.device:
        return self.engine.device

    def update(self, plan: UpdatePlan, step: int = 0) -> UpdateResult:
        """The RL update of one step (the `step`-th of the run): one optimizer step per mini-batch. Every algorithm
        shares it; they differ in their advantages and in what they add to the loss (`algo/base.Algorithm`).

        First the proximal pass (`_proximal`): the old log-probs come from the rollout or the actor before the update
        (`algo.old_logprobs`; recomputed one micro-batch at a time, SimpleVLA-RL's way, except the first
        mini-batch's, which with `algo.old_logprobs_from_update` are read off its own forward, detached), and with a
        value head every row's value is read in the same forward. The algorithm then makes the advantages (and its
        targets) and says which rows train (`Algorithm.prepare`). Then the optimizer steps: the clipped policy loss
        (each token weighed by min(actor / rollout probability, `algo.tis_cap`) with recomputed old log-probs and a
        cap), plus the algorithm's loss terms; where the algorithm says the policy does not train this step (a
        critic's warm-up) only its terms count and the policy's learning rate is 0. The mismatch is measured over
        every valid token of the step (recomputed), or on the first micro-batch before the first optimizer step (the
        rollout's). Every rank must run it with the same number of mini- and micro-batches (ZeRO-3 gathers are
        collectives)."""
        algorithm = self._algorithm()
        started = time.perf_counter()
        proximal = [self._proximal(mini, first=index == 0) for index, mini in enumerate(plan.minis)]
        recompute_s = time.perf_counter() - started
        minis, olds, made = algorithm.prepare(plan, [p.old for p in proximal], [p.values for p in proximal],
                                              self._mean_over_ranks)
        trains = algorithm.policy_trains(step)
        self._policy_lr(self.algo.lr if trains else 0.0)
        steps = [self._optimizer_step(mini, old, step) for mini, old in zip(minis, olds, strict=True)]
        measures = {**made, **_StepStats.term_means(steps), **algorithm.update_metrics(step)}
        return UpdateResult(**_StepStats.means(steps), mismatch=self._mismatch(minis, steps),
                            samples=sum(mini.rows for mini in minis), recompute_s=recompute_s, algorithm=measures)

    def _algorithm(self) -> Algorithm:
        if self.algorithm is None:
            raise RuntimeError("this actor was built for supervised fine-tuning (no algorithm): it has no RL update")
        return self.algorithm

    def _proximal(self, mini: MiniBatch, first: bool) -> _Proximal:
        """The old log-probs of each micro-batch of `mini` and, with a value head, its values, read before the update:
        the rollout's log-probs, the actor's recomputed, or None (the update forward's own, detached: the first
        mini-batch's with `algo.old_logprobs_from_update`, when no value is needed)."""
        recompute = self.algo.old_logprobs == "recompute"
        if not self.has_value_head:
            if not recompute:
                return _Proximal([micro.rollout_logprobs for micro in mini.micro_batches])
            if first and self.algo.old_logprobs_from_update:
                return _Proximal([None] * len(mini.micro_batches))
            return _Proximal([self._old_logprobs(micro) for micro in mini.micro_batches])
        proximal = _Proximal([])
        for micro in mini.micro_batches:
            logprobs, values = self._logprobs_and_values(micro)
            proximal.old.append(logprobs if recompute else micro.rollout_logprobs)
            proximal.values.append(values)
        return proximal

    def _scored(self, inputs: Any, tokens: torch.Tensor, sampled: Mapping[str, torch.Tensor],
                detach_backbone: bool = False) -> tuple[torch.Tensor, Callable[[], torch.Tensor], torch.Tensor | None]:
        """The family's scorer on one forward of the engine (`ChunkScorer.logprobs`): the recorded samples' log-probs
        at the sampling temperature, how to read their entropy and, with a value head, the values
        (`detach_backbone`: the value loss stops at the head)."""
        critic = {"detach_backbone": detach_backbone} if self.has_value_head else {}
        return self.scorer.logprobs(self.engine, self.policy, inputs, tokens, dict(sampled), self.device,
                                    self.algo.temperature, self.trim, **critic)

    @torch.no_grad()
    def _logprobs_and_values(self, micro: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's log-probs of the micro-batch's tokens and the critic's values of its rows, float32 on the
        host, from one forward."""
        logprobs, _, values = self._scored(micro.inputs, micro.tokens, micro.sampled)
        assert values is not None
        return logprobs.float().cpu(), values.float().cpu()

    def _policy_lr(self, lr: float) -> None:
        """The policy's learning rate (the optimizer's first group; a value head has its own group)."""
        if self.has_value_head:  # alone, the policy's group keeps the lr it was built with
            self.engine.optimizer.param_groups[0]["lr"] = lr

    def _mean_over_ranks(self, value: float) -> float:
        world = dist.get_world_size() if dist.is_initialized() else 1
        return mean_over_ranks(value, world, self.device)

    def _mismatch(self, minis: Sequence[MiniBatch], steps: list[_StepStats]) -> Mismatch:
        """The rollout <-> actor gap: over every valid token of the step against the recomputed old log-probs, or
        on the first micro-batch before the first optimizer step when the old are the rollout's."""
        if self.algo.old_logprobs != "recompute":
            return steps[0].first_mismatch
        a = self.algo
        return Mismatch(**logprob_mismatch(
            torch.cat([old for step in steps for old in step.old]),
            torch.cat([micro.rollout_logprobs for mini in minis for micro in mini.micro_batches]),
            torch.cat([micro.mask for mini in minis for micro in mini.micro_batches]), a.clip_low, a.clip_high,
            a.tis_cap))

    def _optimizer_step(self, mini: MiniBatch, old: list[torch.Tensor | None], step: int = 0) -> _StepStats:
        """One optimizer step over the micro-batches of `mini`, accumulated, at the run's `step`; `old[i]` the old
        log-probs of micro-batch i (None: its own forward's, detached). With recomputed old log-probs and
        `algo.tis_cap` > 0 tokens weigh by the truncated importance weights. The loss adds the algorithm's terms
        (`Algorithm.loss_terms`); where the policy does not train at `step` its loss counts 0.

        The weights (`token_weights` of the whole mini-batch, an algorithm's own row weights) make each micro-batch's
        loss its share of the mini-batch's loss, whatever the split, so the losses are summed as they are (no
        division by the number of micro-batches). Metrics are weighted by each micro-batch's valid tokens."""
        algorithm = self._algorithm()
        trains = algorithm.policy_trains(step)
        tis = self.algo.old_logprobs == "recompute" and self.algo.tis_cap > 0
        self.engine.train()
        tokens_total = max(sum(int(micro.mask.sum()) for micro in mini.micro_batches), 1)
        stats = _StepStats()
        for index, micro in enumerate(mini.micro_batches):
            share = int(micro.mask.sum()) / tokens_total
            self.engine.set_gradient_accumulation_boundary(index == len(mini.micro_batches) - 1)
            logprobs, entropy_of, values = self._train_logprobs(micro, algorithm.detach_backbone(step))
            given = old[index]
            old_lp = logprobs.detach() if given is None else given.to(self.device)
            stats.old.append(old_lp.float().cpu())
            weights = micro.weights.to(self.device)
            if tis:
                weights = weights * truncated_is_weights(old_lp, micro.rollout_logprobs.to(self.device),
                                                         self.algo.tis_cap)
            mask = micro.mask.to(self.device)
            loss, info = clipped_policy_loss(logprobs, old_lp, micro.advantages.to(self.device), mask,
                                             self.algo.clip_low, self.algo.clip_high, weights)
            if index == 0:  # before this optimizer step: the rollout <-> actor gap when the old are the rollout's
                stats.first_mismatch = Mismatch(**logprob_mismatch(logprobs.detach(), old_lp, mask, self.algo.clip_low,
                                                                   self.algo.clip_high))
            stats.policy_loss += loss.item()
            term, measures = algorithm.loss_terms(micro, values, self.device)
            for key, value in measures.items():
                stats.terms[key] = stats.terms.get(key, 0.0) + value
            if not trains:
                loss = loss * 0.0
            if term is not None:
                loss = loss + term
            self.engine.backward(loss, scale_wrt_gas=False)
            self.engine.step()
            with torch.no_grad():
                entropy = entropy_of()[mask].mean().nan_to_num().item()
            stats.clip_frac += info["clip_frac"] * share
            stats.approx_kl += info["approx_kl"] * share
            stats.entropy += entropy * share
        if self.streams_states and self._states_stream is not None:
            self._states_stream.wait()  # the last sub-groups' states have reached the host buffers
        stats.grad_norm = float(self.engine.get_global_grad_norm() or 0.0)
        return stats

    def _train_logprobs(self, micro: MicroBatch, detach_backbone: bool
                        ) -> tuple[torch.Tensor, Callable[[], torch.Tensor], torch.Tensor | None]:
        """The update forward's log-probs of the micro-batch's recorded samples (with gradients), how to read their
        entropy (no gradient; after the step) and, with a value head, the values (`detach_backbone`: the value loss
        stops at the head)."""
        return self._scored(micro.inputs, micro.tokens, micro.sampled, detach_backbone)

    @torch.no_grad()
    def _old_logprobs(self, micro: MicroBatch) -> torch.Tensor:
        """The actor's log-probs of the micro-batch's recorded samples before the update (no gradient), float32 on
        the CPU."""
        logprobs, _, _ = self._scored(micro.inputs, micro.tokens, micro.sampled)
        return logprobs.float().cpu()

    def supervised_update(self, micro_batches: Sequence[SupervisedBatch]) -> dict[str, float]:
        """One optimizer step of supervised fine-tuning over `micro_batches`, accumulated: each micro-batch's loss (its
        family's: `models/interface.SupervisedBatch.loss`, run through the engine) weighs by its share of the
        examples, so the split never changes the step. Returns the loss and the family's measures,
        example-weighted, and the gradient norm."""
        self.engine.train()
        total = sum(batch.examples for batch in micro_batches)
        stats: dict[str, float] = {}
        for index, batch in enumerate(micro_batches):
            share = batch.examples / total
            self.engine.set_gradient_accumulation_boundary(index == len(micro_batches) - 1)
            loss, info = batch.loss(self.engine, self.policy, self.device, self.trim)
            self.engine.backward(loss * share, scale_wrt_gas=False)
            self.engine.step()
            for key, value in {"loss": loss.item(), **info}.items():
                stats[key] = stats.get(key, 0.0) + value * share
        stats["grad_norm"] = float(self.engine.get_global_grad_norm() or 0.0)
        return stats

    @torch.no_grad()
    def logprobs(self, inputs: Any, tokens: torch.Tensor, sampled: Mapping[str, torch.Tensor] | None = None
                 ) -> torch.Tensor:
        """The actor's log-probs of recorded `tokens` (and the family's record `sampled`) at the sampling
        temperature (no gradient), float32 on the CPU: the old log-probs of `algo.old_logprobs=recompute`. Every rank
        must call it equally often (ZeRO-3 gathers)."""
        logprobs, _, _ = self._scored(inputs, tokens, sampled or {})
        return logprobs.float().cpu()

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
        """The states back on the device (ZeRO-3), unless they stream through each step (they stay on the host)."""
        if self.streams_states:
            return
        if self.states_offloaded and self._state_holder is not None:
            self._state_holder.reload()
            self.states_offloaded = False

    def save(self, directory: str, tag: str, client_state: dict) -> None:
        """DeepSpeed's files of `directory/tag`; its own `latest` file is not written (the trainer names the latest
        complete checkpoint itself, `checkpoint.publish`)."""
        self.engine.save_checkpoint(directory, tag=tag, client_state=client_state, save_latest=False)

    def load(self, directory: str, tag: str) -> dict:
        path, client_state = self.engine.load_checkpoint(directory, tag=tag)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint {tag!r} under {directory}")
        if self.streams_states and self._state_holder is not None:
            self._state_holder.offload()  # the loaded states, wherever the load put them, into the host buffers
        return client_state

