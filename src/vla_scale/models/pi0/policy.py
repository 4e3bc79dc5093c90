"""Pi0Policy: π0 and π0.5, flow matching over an action chunk, as openpi's PyTorch model computes them.

Sequence, per example (one mask decides who sees whom; `attention_allowed`):

    prefix: [image 0 patches] [image 1] ... [prompt tokens, padded]     all see each other (pads and missing cameras
                                                                         are masked keys)
    suffix: ([state])  [action 0] ... [action H-1]                       π0's state token sees the prefix; the
                                                                         actions see the prefix, the state and
                                                                         each other; the prefix never sees the
                                                                         suffix

Flow matching (openpi's convention: t = 1 is noise, t = 0 the data): x_t = t * noise + (1 - t) * actions, and the
expert's output rows at the actions, projected to the action size, predict the velocity u = noise - actions; the
training loss is the per-element squared error against it (`flow_loss`, given the noise and the time, so that a
caller, or a test, fixes both). `sample_actions` starts from noise at t = 1 and takes K Euler steps of dt = -1/K to
t = 0, computing the prefix once (its keys and values per layer) and only the suffix at every step.

For RL the same steps become Gaussian transitions: Flow-SDE's (`objectives/flow_sde.py`, of a noise level) or, for a
policy built with a noise head (`noise_std=`, `models/pi0/noise_head.py`), Flow-Noise's (`objectives/flow_noise.py`:
the Euler step plus noise whose std the head reads from the expert's output rows). `sample_chain` samples a chain and
keeps every x_t and each step's log-prob, `chain_logprobs` recomputes those log-probs from a stored chain in one
batched pass (the actor's update, with gradients into the policy and the noise head). A step left deterministic
(noise level 0, or not chosen) is `sample_actions`' step bit for bit; `sample_actions` never reads the noise head.

The time enters as a sine-cosine embedding of width = the expert's (periods 4e-3 to 4, computed in float64 as
openpi does): π0 concatenates it to each action token's embedding and mixes them with a 2-layer swish MLP; π0.5
turns it into the adaRMS conditioning of every norm of the expert (`models/pi0/gemma.py`) and feeds the actions
alone. Parameter names are openpi's `PI0Pytorch` (`action_in_proj`, `state_proj`, `time_mlp_in`,
`paligemma_with_expert.*`, ...), so its state_dict loads with no renaming (`load_openpi_state_dict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vla_scale.models.critic import read_rows
from vla_scale.models.lora import ServesMerged
from vla_scale.models.pi0.backbone import KVCache, PaliGemmaWithExpert, Streams
from vla_scale.models.pi0.gemma import MASKED, AdaRMSNorm
from vla_scale.models.pi0.noise_head import PREFIX as NOISE_HEAD_PREFIX
from vla_scale.models.pi0.noise_head import NoiseHead
from vla_scale.models.pi0.spec import Pi0Spec, check_spec, spec_from_openpi
from vla_scale.objectives.flow_noise import flow_noise_transition, step_entropy
from vla_scale.objectives.flow_sde import euler_times, gaussian_logprob, sde_transition

TIME_PERIODS = (4e-3, 4.0)
"""Shortest and longest period of the time embedding's sines (openpi's `min_period`, `max_period`)."""


@dataclass
class Pi0Inputs:
    """One batch of observations as the model reads them (already normalised, tokenised and padded)."""

    images: Tensor  # float[B, N, 3, S, S] in [-1, 1], one slot per camera
    image_masks: Tensor  # bool[B, N]: False where the camera is missing (its patches are masked keys)
    tokens: Tensor  # int64[B, L]: the prompt (π0.5: with the discretised state), right-padded
    token_masks: Tensor  # bool[B, L]
    state: Tensor  # float[B, action_dim]: normalised, zero-padded (π0 reads it; π0.5's is in the prompt)


@dataclass
class FlowChain:
    """One sampled denoising chain per example (`Pi0Policy.sample_chain`): what the actor needs to score it again."""

    actions: Tensor  # float32[B, H, action_dim]: the chain's end, the normalised actions
    chain: Tensor  # float32[B, K + 1, H, action_dim]: x at t = 1 (the noise), then after each of the K steps
    logprobs: Tensor  # float32[B, K]: each step's log-prob over the mask; 0 for a deterministic step
    stochastic: Tensor  # bool[B, K]: the steps that were Gaussian transitions (the others Euler steps)


def pixels_from_uint8(images: Tensor) -> Tensor:
    """Camera images uint8[..., H, W, 3] -> float32[..., 3, H, W] in [-1, 1], openpi's conversion to the operation."""
    return images.to(torch.float32).movedim(-1, -3) / 255.0 * 2.0 - 1.0


def attention_allowed(pad: Tensor, blocks: Tensor) -> Tensor:
    """bool[B, Lq, Lk] from pad bool[B, L] and block starts [B, L] (1 where a new block begins): a query sees a key
    when both are real tokens and the key's block is not after the query's (big_vision's prefix-LM rule)."""
    block = torch.cumsum(blocks, dim=1)
    return (block[:, None, :] <= block[:, :, None]) & pad[:, None, :] & pad[:, :, None]


def additive(allowed: Tensor) -> Tensor:
    """bool[B, Lq, Lk] -> the float32 mask [B, 1, Lq, Lk] added to the attention scores."""
    return torch.where(allowed, 0.0, MASKED)[:, None]


def time_embedding(time: Tensor, width: int) -> Tensor:
    """Sine-cosine embedding [B, width] of flow times [B] (float64 inside, returned in the time's dtype)."""
    low, high = TIME_PERIODS
    fraction = torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64, device=time.device)
    period = low * (high / low) ** fraction
    angle = (1.0 / period * 2 * math.pi)[None, :] * time[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).to(time.dtype)


class Pi0Policy(ServesMerged, nn.Module):
    """PaliGemma + the action expert + the action/state/time projections of π0 (or π0.5 with `spec.pi05`), and with
    `noise_std` (min, max) Flow-Noise's noise head. With LoRA adapters (`models/lora.add_adapters`) it serves its
    weights merged (`served`)."""

    def __init__(self, spec: Pi0Spec, zero3_init: bool = False, noise_std: tuple[float, float] | None = None):
        super().__init__()
        check_spec(spec)
        self.spec = spec
        width = spec.expert.width
        self.paligemma_with_expert = PaliGemmaWithExpert(spec, zero3_init)
        self.action_in_proj = nn.Linear(spec.action_dim, width)
        self.action_out_proj = nn.Linear(width, spec.action_dim)
        if spec.pi05:
            self.time_mlp_in, self.time_mlp_out = nn.Linear(width, width), nn.Linear(width, width)
        else:
            self.state_proj = nn.Linear(spec.action_dim, width)
            self.action_time_mlp_in = nn.Linear(2 * width, width)
            self.action_time_mlp_out = nn.Linear(width, width)
        self.noise_head = None if noise_std is None else NoiseHead(width, spec.action_dim, *noise_std)
        """Flow-Noise's std network, or None (Flow-SDE, evaluation); built last, so the other parameters' init is
        the same with or without it."""

    # ---- construction -----------------------------------------------------------------------------------------------
    @classmethod
    def from_openpi_config(cls, config: dict, pi05: bool | None = None) -> Pi0Policy:
        """A policy of an openpi config.json (`spec.spec_from_openpi`) with torch's default init: load weights next
        (`load_openpi_state_dict`)."""
        return cls(spec_from_openpi(config, pi05))

    @classmethod
    def from_spec(cls, spec: Pi0Spec, dtype: torch.dtype | None = None, device: str | None = None,
                  zero3_init: bool = False, noise_std: tuple[float, float] | None = None) -> Pi0Policy:
        """A freshly initialised policy (seed torch first for a reproducible one): linear and embedding weights
        normal(0, 0.02), biases 0, RMS norms the identity, adaRMS maps 0 (so the expert starts unconditioned).
        `zero3_init`: the caller builds it inside `deepspeed.zero.Init`, where every parameter is an empty shard once
        built; each initialised module is then gathered while its init runs (the same draws, in the same order).
        `noise_std`: with Flow-Noise's noise head of these std bounds."""
        policy = cls(spec, zero3_init, noise_std)
        policy.apply(_init_gathered if zero3_init else _init_weights)
        return policy if zero3_init else policy.to(dtype=dtype, device=device)

    def load_openpi_state_dict(self, tensors: dict[str, Tensor], prefix: str = "") -> None:
        """Copy an openpi `PI0Pytorch` state_dict in (LeRobot's folders: `prefix="model."`). Exactly our keys are
        required, except that one of PaliGemma's tied pair (LM head, token embedding) stands for both, as
        safetensors keeps only one, and that a noise head's tensors may be left out (it keeps its own); anything
        missing, unexpected or of another shape is refused by name."""
        tensors = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        ours = self.state_dict()
        head = {k for k in ours if k.startswith(NOISE_HEAD_PREFIX)}
        whole = head <= set(tensors)
        if not whole:
            ours = {k: v for k, v in ours.items() if k not in head}
        head = "paligemma_with_expert.paligemma.lm_head.weight"
        embed = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
        if head in tensors or embed in tensors:
            tensors.setdefault(head, tensors.get(embed)), tensors.setdefault(embed, tensors[head])
        missing, unexpected = sorted(set(ours) - set(tensors)), sorted(set(tensors) - set(ours))
        shapes = [f"{k} {tuple(tensors[k].shape)} (ours {tuple(ours[k].shape)})" for k in ours
                  if k in tensors and tensors[k].shape != ours[k].shape]
        problems = [f"{what}: {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}"
                    for what, keys in (("missing", missing), ("unexpected", unexpected), ("other shapes", shapes))
                    if keys]
        if problems:
            raise ValueError("not a π0 state_dict of this spec; " + "; ".join(problems))
        self.load_state_dict(tensors, strict=whole)

    # ---- embeddings -------------------------------------------------------------------------------------------------
    @property
    def compute_dtype(self) -> torch.dtype:
        return self.action_in_proj.weight.dtype

    def embed_prefix(self, inputs: Pi0Inputs, skip_masked_slots: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """(embeddings [B, P, PaliGemma width], pad bool[B, P], block starts bool[B, P]: none, the prefix is one
        block). Images go through the tower one camera slot at a time, as openpi runs them; the prompt's token
        embeddings are scaled by sqrt(width) (Gemma's convention, here outside the model). `skip_masked_slots`:
        a camera slot masked in every row is left out (no key attends to it and its positions are not counted, so
        the prefix computes the same; a third less work for LIBERO's two cameras in three slots). Only where the
        module is not ZeRO-3's: every rank must run the tower equally often."""
        backbone = self.paligemma_with_expert
        embs, pads = [], []
        for n in range(inputs.images.shape[1]):
            if skip_masked_slots and not bool(inputs.image_masks[:, n].any()):
                continue
            patches = backbone.embed_image(inputs.images[:, n].to(self.compute_dtype))
            embs.append(patches)
            pads.append(inputs.image_masks[:, n, None].expand(-1, patches.shape[1]))
        language = backbone.embed_tokens(inputs.tokens)
        embs.append(language * math.sqrt(language.shape[-1]))
        pads.append(inputs.token_masks.bool())
        pad = torch.cat(pads, dim=1)
        return torch.cat(embs, dim=1), pad, torch.zeros_like(pad)

    def embed_suffix(self, state: Tensor, noisy_actions: Tensor, time: Tensor
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """(embeddings [B, S, expert width], pad [B, S], block starts [B, S], adaRMS conditioning or None).

        π0: [state token] starts a block (the prefix cannot see it), the first action token starts another, the
        rest of the actions join it. π0.5: the actions only, one block."""
        batch, horizon = noisy_actions.shape[:2]
        width = self.action_in_proj.out_features
        emb_time = time_embedding(time, width).to(self.compute_dtype)
        actions = self.action_in_proj(noisy_actions.to(self.compute_dtype))
        starts = [True] + [False] * (horizon - 1)
        if self.spec.pi05:
            cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb_time))))
            embs = actions
        else:
            cond = None
            mixed = torch.cat([actions, emb_time[:, None, :].expand_as(actions)], dim=2)
            tokens = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(mixed)))
            embs = torch.cat([self.state_proj(state.to(self.compute_dtype))[:, None, :], tokens], dim=1)
            starts = [True] + starts
        device = noisy_actions.device
        block = torch.tensor(starts, device=device)[None, :].expand(batch, -1)
        return embs, torch.ones(batch, len(starts), dtype=torch.bool, device=device), block, cond

    # ---- training ---------------------------------------------------------------------------------------------------
    def velocity_joint(self, inputs: Pi0Inputs, x_t: Tensor, time: Tensor) -> Tensor:
        """The predicted velocity float32[B, H, action_dim] at (x_t, time) from one pass over prefix and suffix."""
        prefix, prefix_pad, prefix_blocks = self.embed_prefix(inputs)
        suffix, suffix_pad, suffix_blocks, cond = self.embed_suffix(inputs.state, x_t, time)
        pad = torch.cat([prefix_pad, suffix_pad], dim=1)
        allowed = attention_allowed(pad, torch.cat([prefix_blocks, suffix_blocks], dim=1).long())
        streams = Streams(prefix=prefix.to(self.compute_dtype), suffix=suffix.to(self.compute_dtype),
                          mask=additive(allowed), positions=torch.cumsum(pad, dim=1) - 1, cond=cond)
        _, out, _ = self.paligemma_with_expert.run(streams)
        return self.action_out_proj(out[:, -self.spec.action_horizon :].to(self.compute_dtype)).float()

    def flow_loss(self, inputs: Pi0Inputs, actions: Tensor, noise: Tensor, time: Tensor) -> Tensor:
        """Per-element squared error float32[B, H, action_dim] between the predicted and the true velocity at
        x_t = t * noise + (1 - t) * actions (time [B] in (0, 1]; openpi draws it from 0.001 + 0.999 * Beta(1.5, 1))."""
        t = time[:, None, None]
        x_t = t * noise + (1 - t) * actions
        return F.mse_loss(noise - actions, self.velocity_joint(inputs, x_t, time), reduction="none")

    def forward(self, inputs: Pi0Inputs, *args: Tensor, **kwargs: Any) -> Tensor | tuple[Tensor, Tensor]:
        """What the DeepSpeed engine runs: `flow_loss(inputs, actions, noise, time)` (SFT), or with `chain=`
        `chain_logprobs(inputs, chain=, noise_level=, stochastic=, mask=, with_entropy=)` (RL's update)."""
        if "chain" in kwargs:
            return self.chain_logprobs(inputs, **kwargs)
        return self.flow_loss(inputs, *args, **kwargs)

    # ---- sampling ---------------------------------------------------------------------------------------------------
    def prefix_cache(self, inputs: Pi0Inputs) -> tuple[KVCache, Tensor]:
        """Every layer's keys and values of the prefix, and its pad mask: what every denoising step attends to
        (camera slots masked in every row left out)."""
        cache, pad, _ = self.prefix_pass(inputs, skip_masked_slots=True)
        return cache, pad

    def prefix_pass(self, inputs: Pi0Inputs, skip_masked_slots: bool = False) -> tuple[KVCache, Tensor, Tensor]:
        """`prefix_cache`'s cache and pad mask, and the prefix's hidden states [B, T, width] after PaliGemma's final
        norm (what a value head reads). `skip_masked_slots`: as `embed_prefix`'s (the sampling's; the update's
        pass keeps every slot)."""
        prefix, pad, blocks = self.embed_prefix(inputs, skip_masked_slots)
        streams = Streams(prefix=prefix.to(self.compute_dtype), suffix=None,
                          mask=additive(attention_allowed(pad, blocks.long())),
                          positions=torch.cumsum(pad, dim=1) - 1)
        out, _, cache = self.paligemma_with_expert.run(streams, keep_cache=True)
        assert out is not None
        return cache, pad, out

    def denoise_step(self, state: Tensor, prefix_pad: Tensor, cache: KVCache, x_t: Tensor, time: Tensor) -> Tensor:
        """The velocity float32[B, H, action_dim] at (x_t, time [B]), the suffix attending to the prefix's cache."""
        return self.velocity(self.suffix_rows(state, prefix_pad, cache, x_t, time))

    def velocity(self, rows: Tensor) -> Tensor:
        """The velocity float32[B, H, action_dim] the expert's output rows at the actions [B, H, width] predict."""
        return self.action_out_proj(rows.to(self.compute_dtype)).float()

    def suffix_rows(self, state: Tensor, prefix_pad: Tensor, cache: KVCache, x_t: Tensor, time: Tensor) -> Tensor:
        """The expert's output rows at the actions [B, H, width] (after its final norm) at (x_t, time [B]), the
        suffix attending to the prefix's cache: what the velocity and the noise head read."""
        suffix, pad, blocks, cond = self.embed_suffix(state, x_t, time)
        queries = suffix.shape[1]
        to_prefix = prefix_pad[:, None, :].expand(-1, queries, -1)
        allowed = torch.cat([to_prefix, attention_allowed(pad, blocks.long())], dim=2)
        positions = prefix_pad.sum(dim=1, keepdim=True) + torch.cumsum(pad, dim=1) - 1
        streams = Streams(prefix=None, suffix=suffix.to(self.compute_dtype), mask=additive(allowed),
                          positions=positions, cond=cond)
        _, out, _ = self.paligemma_with_expert.run(streams, cache=cache)
        assert out is not None
        return out[:, -self.spec.action_horizon :]

    def sample_noise(self, batch: int, device: torch.device | str | None = None,
                     generator: torch.Generator | None = None) -> Tensor:
        """Standard normal float32[batch, H, action_dim], the chain's start."""
        shape = (batch, self.spec.action_horizon, self.spec.action_dim)
        return torch.randn(shape, generator=generator, dtype=torch.float32, device=device)

    @torch.no_grad()
    def sample_actions(self, inputs: Pi0Inputs, noise: Tensor, num_steps: int | None = None) -> Tensor:
        """Normalised actions float32[B, H, action_dim]: K Euler steps (`num_steps`, default the spec's) from `noise`
        at t = 1 to t = 0, the prefix computed once. The times are accumulated in float32 (1, 1 + dt, ...) exactly
        as openpi's loop does, so the chain is openpi's step for step."""
        steps = num_steps or self.spec.num_steps
        cache, prefix_pad = self.prefix_cache(inputs)
        dt = torch.tensor(-1.0 / steps, dtype=torch.float32, device=noise.device)
        time = torch.tensor(1.0, dtype=torch.float32, device=noise.device)
        x_t = noise
        for _ in range(steps):
            v_t = self.denoise_step(inputs.state, prefix_pad, cache, x_t, time.expand(noise.shape[0]))
            x_t = x_t + dt * v_t
            time = time + dt
        return x_t

    @torch.no_grad()
    def sample_chain(self, inputs: Pi0Inputs, noise: Tensor, noise_level: float | Tensor = 0.0,
                     generator: torch.Generator | None = None, step_noise: Tensor | None = None,
                     stochastic: Tensor | None = None, mask: Tensor | None = None,
                     num_steps: int | None = None) -> FlowChain:
        """K denoising steps from `noise` at t = 1, each a Flow-SDE transition of noise level a (a float or [B]),
        or with a noise head a Flow-Noise transition (its std from the head; `noise_level` unused), the prefix
        computed once. The steps' standard normal draws come from `step_noise` float32[B, K, H, D], else from
        `generator`, all drawn before the first step. `stochastic` bool[B, K] (default: all) picks the steps that
        are transitions; the others are the plain Euler step (Flow-SDE with a = 0; πRL's mixed ODE-SDE sampling
        makes one step per chain stochastic). `mask` (bool, broadcastable to [B, H, D]:
        `objectives.flow_sde.action_mask`) is where the log-probs count. With a = 0 everywhere (or no step chosen)
        the actions are `sample_actions`' bit for bit."""
        steps = num_steps or self.spec.num_steps
        batch = noise.shape[0]
        chosen = _steps_chosen(stochastic, batch, steps, noise.device)
        if step_noise is None:
            step_noise = torch.randn((batch, steps, *noise.shape[1:]), generator=generator, dtype=torch.float32,
                                     device=noise.device)
        cache, prefix_pad = self.prefix_cache(inputs)
        times, dt = euler_times(steps, noise.device)
        x_t, chain, logprobs = noise, [noise.float()], []
        for k in range(steps):
            rows = self.suffix_rows(inputs.state, prefix_pad, cache, x_t, times[k].expand(batch))
            v_t = self.velocity(rows)
            if self.noise_head is None:
                mean, std = sde_transition(x_t, v_t, times[k], dt, chosen[:, k].float() * noise_level)
            else:
                mean, std = flow_noise_transition(x_t, v_t, dt, self.noise_head(rows), chosen[:, k])
            x_t = mean + std * step_noise[:, k]
            logprobs.append(gaussian_logprob(x_t, mean, std, mask))
            chain.append(x_t.float())
        return FlowChain(actions=x_t, chain=torch.stack(chain, dim=1), logprobs=torch.stack(logprobs, dim=1),
                         stochastic=chosen)

    def chain_logprobs(self, inputs: Pi0Inputs, chain: Tensor, noise_level: float | Tensor = 0.0,
                       stochastic: Tensor | None = None, mask: Tensor | None = None, with_entropy: bool = False
                       ) -> Tensor | tuple[Tensor, Tensor]:
        """Each step's log-prob float32[B, K] of a stored chain float32[B, K + 1, H, D] (`FlowChain.chain`; K is
        read from it), as `sample_chain` computed them, with gradients into the policy (and its noise head). The
        prefix runs once; the stochastic steps of every example (`stochastic` bool[B, K], default all; the others
        are 0) run as one batch of suffix passes, each row attending to its example's cached prefix (the cache rows
        are gathered, a copy per step: the memory of K separate passes, in one). `with_entropy`: also each step's
        Gaussian entropy float32[B, K] over the mask (Flow-Noise's depends on the weights, so it comes from this
        pass)."""
        cache, prefix_pad, _ = self.prefix_pass(inputs)
        return self._steps_logprobs(inputs, cache, prefix_pad, chain, noise_level, stochastic, mask, with_entropy)

    def value_features(self, inputs: Pi0Inputs, *, position: str, chain: Tensor, noise_level: float | Tensor = 0.0,
                       stochastic: Tensor | None = None, mask: Tensor | None = None, with_entropy: bool = False
                       ) -> tuple[Tensor | tuple[Tensor, Tensor], Tensor]:
        """`chain_logprobs` and, from the same prefix pass, the hidden state [B, width] a value head reads
        (`models/critic.py`): the last valid prefix row's (`prompt_last`; the prompt's last token) or the mean over
        the valid prefix rows (`action_mean`: the rows every denoising step attends to)."""
        cache, pad, out = self.prefix_pass(inputs)
        steps = self._steps_logprobs(inputs, cache, pad, chain, noise_level, stochastic, mask, with_entropy)
        if position == "prompt_last":
            last = (pad.long() * torch.arange(pad.shape[1], device=pad.device)).argmax(dim=1)
            return steps, out[torch.arange(len(out), device=out.device), last]
        return steps, read_rows(out, position, valid=pad)

    # ---- how the actor trains it ------------------------------------------------------------------------------------
    zero3_leaf_types: tuple[type[nn.Module], ...] = ()
    """None here: the joint layers call into both Gemmas' submodules, so ZeRO-3 gathers per submodule."""

    def activation_checkpointing_enable(self) -> None:
        """Every joint layer and SigLIP block keeps only its input in training and recomputes the rest in the
        backward pass (`deepspeed.activation_checkpointing`)."""
        tower = self.paligemma_with_expert.paligemma.model.vision_tower.vision_model
        enable = getattr(tower, "activation_checkpointing_enable", None) or tower.gradient_checkpointing_enable
        enable({"use_reentrant": False})
        self.recompute_layers(-1)

    def recompute_layers(self, count: int) -> None:
        """The first `count` joint layers recompute in the backward pass, the rest keep their activations (-1:
        all)."""
        self.paligemma_with_expert.recompute = count

    @property
    def value_width(self) -> int:
        """The width of the hidden state a value head reads (PaliGemma's Gemma)."""
        return self.spec.paligemma.width

    def _steps_logprobs(self, inputs: Pi0Inputs, cache: KVCache, prefix_pad: Tensor, chain: Tensor,
                        noise_level: float | Tensor, stochastic: Tensor | None, mask: Tensor | None,
                        with_entropy: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """`chain_logprobs` on a prefix already run."""
        batch, steps = chain.shape[0], chain.shape[1] - 1
        rows, ks = _steps_chosen(stochastic, batch, steps, chain.device).nonzero(as_tuple=True)
        out = torch.zeros(batch, steps, dtype=torch.float32, device=chain.device)
        if rows.numel() == 0:
            return (out, out) if with_entropy else out
        cache = [(keys[rows], values[rows]) for keys, values in cache]
        times, dt = euler_times(steps, chain.device)
        x_t = chain[rows, ks]
        hidden = self.suffix_rows(inputs.state[rows], prefix_pad[rows], cache, x_t, times[ks])
        v_t = self.velocity(hidden)
        if self.noise_head is None:
            level = noise_level[rows] if isinstance(noise_level, Tensor) and noise_level.dim() else noise_level
            mean, std = sde_transition(x_t, v_t, times[ks], dt, level)
        else:
            mean, std = flow_noise_transition(x_t, v_t, dt, self.noise_head(hidden))
        if mask is not None and mask.dim() == 3:
            mask = mask.expand(batch, -1, -1)[rows]
        logprobs = out.index_put((rows, ks), gaussian_logprob(chain[rows, ks + 1], mean, std, mask))
        if not with_entropy:
            return logprobs
        return logprobs, out.index_put((rows, ks), step_entropy(std.expand_as(x_t), mask))


def _steps_chosen(stochastic: Tensor | None, batch: int, steps: int, device: torch.device) -> Tensor:
    """bool[B, K]: the given choice of stochastic steps (checked against the chain's shape), else every step."""
    if stochastic is None:
        return torch.ones(batch, steps, dtype=torch.bool, device=device)
    if stochastic.shape != (batch, steps):
        raise ValueError(f"stochastic must be bool[{batch}, {steps}], got {tuple(stochastic.shape)}")
    return stochastic.to(device=device, dtype=torch.bool)


def _init_weights(module: nn.Module) -> None:
    """A fresh policy's init (`Pi0Policy.from_spec`; `Module.apply` visits an adaRMS norm after its `dense`)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
        if module.padding_idx is not None:
            nn.init.zeros_(module.weight[module.padding_idx])
    elif isinstance(module, AdaRMSNorm):
        nn.init.zeros_(module.dense.weight), nn.init.zeros_(module.dense.bias)


def _init_gathered(module: nn.Module) -> None:
    """`_init_weights` of one module whose parameters are ZeRO-3 shards: gathered, set on rank 0, scattered back."""
    if isinstance(module, nn.Linear | nn.Embedding | AdaRMSNorm):
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0):
            _init_weights(module)
