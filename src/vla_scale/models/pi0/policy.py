"""Pi0Policy: π0 and π0.5, flow matching over an action chunk, as openpi's PyTorch model computes them.

Sequence, per example (one mask decides who sees whom; `attention_allowed`):

    prefix: [image 0 patches] [image 1] ... [prompt tokens, padded]     all see each other (pads and missing cameras
                                                                         are masked keys)
    suffix: ([state])  [action 0] ... [action H-1]                       π0's state token sees the prefix; the
                                                                         actions see the prefix, the state and
                                                                         each other; the prefix never sees the
                                                                         suffix

Flow matching, the Euler sampler and the RL chains (Flow-SDE, Flow-Noise with `noise_std=`) are the shared
`FlowPolicy`'s (`models/flow/policy.py`, openpi's convention: t = 1 is noise, t = 0 the data); this class provides
its prefix pass (the prefix's keys and values per layer, computed once per observation), its suffix pass and the
joint pass of the training loss. The Euler times accumulate in float32, as openpi's loop does.

The time enters as a sine-cosine embedding of width = the expert's (periods 4e-3 to 4, computed in float64 as
openpi does): π0 concatenates it to each action token's embedding and mixes them with a 2-layer swish MLP; π0.5
turns it into the adaRMS conditioning of every norm of the expert (`models/pi0/gemma.py`) and feeds the actions
alone. Parameter names are openpi's `PI0Pytorch` (`action_in_proj`, `state_proj`, `time_mlp_in`,
`paligemma_with_expert.*`, ...), so its state_dict loads with no renaming (`load_openpi_state_dict`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vla_scale.models.flow.noise_head import NoiseHead
from vla_scale.models.flow.policy import (
    TIME_PERIODS,
    FlowChain,
    FlowInputs,
    FlowPolicy,
    additive,
    attention_allowed,
    gathered,
    init_linear,
)
from vla_scale.models.flow.policy import time_embedding as time_embedding
from vla_scale.models.pi0.backbone import KVCache, PaliGemmaWithExpert, Streams
from vla_scale.models.pi0.gemma import AdaRMSNorm
from vla_scale.models.pi0.spec import Pi0Spec, check_spec, spec_from_openpi

__all__ = ["TIME_PERIODS", "FlowChain", "Pi0Inputs", "Pi0Policy", "additive", "attention_allowed",
           "pixels_from_uint8", "time_embedding"]

Pi0Inputs = FlowInputs
"""One batch of observations as the model reads them (the shared `FlowInputs`; π0.5's prompt holds the state)."""


def pixels_from_uint8(images: Tensor) -> Tensor:
    """Camera images uint8[..., H, W, 3] -> float32[..., 3, H, W] in [-1, 1], openpi's conversion to the operation."""
    return images.to(torch.float32).movedim(-1, -3) / 255.0 * 2.0 - 1.0


class Pi0Policy(FlowPolicy):
    """PaliGemma + the action expert + the action/state/time projections of π0 (or π0.5 with `spec.pi05`), and with
    `noise_std` (min, max) Flow-Noise's noise head, over the shared flow machinery (`FlowPolicy`)."""

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
        policy.apply(gathered(_init_weights, (nn.Linear, nn.Embedding, AdaRMSNorm)) if zero3_init else _init_weights)
        return policy if zero3_init else policy.to(dtype=dtype, device=device)

    def load_openpi_state_dict(self, tensors: dict[str, Tensor], prefix: str = "") -> None:
        """Copy an openpi `PI0Pytorch` state_dict in (LeRobot's folders: `prefix="model."`). Exactly our keys are
        required, except that one of PaliGemma's tied pair (LM head, token embedding) stands for both, as
        safetensors keeps only one, and that a noise head's tensors may be left out (it keeps its own); anything
        missing, unexpected or of another shape is refused by name."""
        tensors = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        self.load_checked_state_dict(tensors, "π0", ("paligemma_with_expert.paligemma.lm_head.weight",
                                                     "paligemma_with_expert.paligemma.model.language_model."
                                                     "embed_tokens.weight"))

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

    # ---- the passes the shared sampler and the chains run ------------------------------------------------------------
    def prefix_pass(self, inputs: Pi0Inputs, skip_masked_slots: bool = False) -> tuple[KVCache, Tensor, Tensor]:
        """The prefix's keys and values per layer, its pad mask, and its hidden states [B, T, width] after
        PaliGemma's final norm (what a value head reads). `skip_masked_slots`: as `embed_prefix`'s (the sampling's;
        the update's pass keeps every slot)."""
        prefix, pad, blocks = self.embed_prefix(inputs, skip_masked_slots)
        streams = Streams(prefix=prefix.to(self.compute_dtype), suffix=None,
                          mask=additive(attention_allowed(pad, blocks.long())),
                          positions=torch.cumsum(pad, dim=1) - 1)
        out, _, cache = self.paligemma_with_expert.run(streams, keep_cache=True)
        assert out is not None
        return cache, pad, out

    def prefix_blocks(self) -> list[nn.Module]:
        """SigLIP's encoder layers and PaliGemma's Gemma layers (the expert's run in the suffix passes)."""
        backbone = self.paligemma_with_expert
        return [backbone.paligemma.model.vision_tower.vision_model.encoder.layers, backbone.language_model.layers]

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


def _init_weights(module: nn.Module) -> None:
    """A fresh policy's init (`Pi0Policy.from_spec`; `Module.apply` visits an adaRMS norm after its `dense`)."""
    init_linear(module)
    if isinstance(module, AdaRMSNorm):
        nn.init.zeros_(module.dense.weight), nn.init.zeros_(module.dense.bias)
