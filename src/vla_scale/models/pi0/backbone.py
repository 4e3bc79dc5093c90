"""PaliGemma and the action expert: two transformers that attend over one sequence, layer by layer.

π0's sequence is a prefix (camera images through SigLIP and PaliGemma's projector, then the prompt's tokens) read by
PaliGemma's Gemma, followed by a suffix (π0's state token and the noisy actions) read by the smaller Gemma expert.
In every layer each stream normalises and projects its own tokens with its own weights, the queries, keys and
values of both are concatenated along the sequence and attend together under one mask (with one rotary table:
both Gemmas share head size and key/value heads), and the attention output is cut back into the two streams, each
going through its own output projection, norms and MLP (`PaliGemmaWithExpert.run`).

The same layer function serves the three ways π0 runs it: both streams at once (the training loss), the prefix
alone keeping every layer's keys and values (the cache `sample_actions` computes once per observation), and the
suffix alone attending to that cache (each denoising step). Parameter names are openpi's `PaliGemmaWithExpertModel`
(`paligemma.model.vision_tower.vision_model.*`, `paligemma.model.multi_modal_projector.linear.*`,
`paligemma.model.language_model.*`, `gemma_expert.model.*`, both `lm_head`s).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import SiglipVisionConfig, SiglipVisionModel

from vla_scale.models.flow.policy import run_layer
from vla_scale.models.pi0.gemma import GemmaForCausalLM, GemmaLayer, attend, gated, normalize, rotate
from vla_scale.models.pi0.spec import Pi0Spec, SiglipSpec

KVCache = list[tuple[Tensor, Tensor]]
"""Per layer, the prefix's rotated keys and its values [B, KV, P, head_dim]."""


class SiglipTower(nn.Module):
    """transformers' SigLIP vision model (no pooling head, eager attention) under `vision_model`, where openpi's
    transformers version keeps it; last hidden states after the post-layernorm."""

    def __init__(self, spec: SiglipSpec, zero3_init: bool = False):
        """`zero3_init`: built inside `deepspeed.zero.Init`, where each layer is an empty shard once built, so
        transformers' init is deferred and run by its ZeRO-3 variant, which gathers each module first."""
        super().__init__()
        config = SiglipVisionConfig(
            hidden_size=spec.width, intermediate_size=spec.mlp_dim, num_hidden_layers=spec.depth,
            num_attention_heads=spec.num_heads, image_size=spec.image_size, patch_size=spec.patch_size,
            layer_norm_eps=spec.layer_norm_eps, hidden_act="gelu_pytorch_tanh", vision_use_head=False,
            attn_implementation="eager",
        )
        if not zero3_init:
            self.vision_model = SiglipVisionModel(config)
            return
        from transformers import initialization

        with initialization.no_init_weights():
            self.vision_model = SiglipVisionModel(config)
        self._init_gathered(self.vision_model)

    def _init_gathered(self, module: nn.Module) -> None:
        """transformers' SigLIP init of every module, children first, each with its own and its direct children's
        parameters gathered (the init reaches into children: `module.q_proj.weight`), set on rank 0 and scattered
        back. Written out here: transformers' own ZeRO-3 variant gathers the children's only in its newer
        versions."""
        import deepspeed

        for child in module.children():
            self._init_gathered(child)
        params = [*module.parameters(recurse=False), *(p for c in module.children() for p in c.parameters(False))]
        with torch.no_grad(), deepspeed.zero.GatheredParameters(params, modifier_rank=0, enabled=bool(params)):
            if not deepspeed.comm.is_initialized() or deepspeed.comm.get_rank() == 0:
                self.vision_model._init_weights(module)

    def forward(self, pixels: Tensor) -> Tensor:
        return self.vision_model(pixels).last_hidden_state


class Projector(nn.Module):
    """PaliGemma's multimodal projector: one linear map from the tower's width to Gemma's (no 1/sqrt(width) scaling
    in openpi's version)."""

    def __init__(self, vision_width: int, width: int):
        super().__init__()
        self.linear = nn.Linear(vision_width, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x)


class PaliGemmaModel(nn.Module):
    def __init__(self, spec: Pi0Spec, zero3_init: bool = False):
        super().__init__()
        self.vision_tower = SiglipTower(spec.vision, zero3_init)
        self.multi_modal_projector = Projector(spec.vision.width, spec.paligemma.width)
        lm = GemmaForCausalLM(spec.paligemma, spec.vocab_size)
        self.language_model = lm.model


class PaliGemma(nn.Module):
    """`model` (tower, projector, Gemma) and the LM head, tied to the token embedding as in PaliGemma."""

    def __init__(self, spec: Pi0Spec, zero3_init: bool = False):
        super().__init__()
        self.model = PaliGemmaModel(spec, zero3_init)
        self.lm_head = nn.Linear(spec.paligemma.width, spec.vocab_size, bias=False)
        self.lm_head.weight = self.model.language_model.embed_tokens.weight


@dataclass
class Streams:
    """What one pass runs: the prefix and/or suffix embeddings, the suffix's adaRMS conditioning, the additive mask
    over [queries, all keys] and the positions of the queries."""

    prefix: Tensor | None
    suffix: Tensor | None
    mask: Tensor  # [B, 1, queries, keys]: 0 where a query sees a key, gemma.MASKED elsewhere
    positions: Tensor  # [B, queries]
    cond: Tensor | None = None  # [B, expert width]: π0.5's time embedding


class PaliGemmaWithExpert(nn.Module):
    """The two Gemmas, the SigLIP tower and the projector, run jointly (module docstring)."""

    rotary = staticmethod(rotate)
    """The rotary embedding of each layer's queries and keys (`models/liger.py` puts Liger's kernel here)."""

    def __init__(self, spec: Pi0Spec, zero3_init: bool = False):
        super().__init__()
        self.spec = spec
        self.paligemma = PaliGemma(spec, zero3_init)
        cond = spec.expert.width if spec.pi05 else 0
        self.gemma_expert = GemmaForCausalLM(spec.expert, spec.vocab_size, cond_dim=cond, embeds_tokens=False)
        self.scaling = spec.paligemma.head_dim ** -0.5
        self.recompute = 0
        """Joint layers that keep only their inputs in training and recompute in the backward pass: the first
        `recompute` (-1: all; `Pi0Policy.recompute_layers`)."""

    @property
    def language_model(self) -> nn.Module:
        return self.paligemma.model.language_model

    def embed_image(self, pixels: Tensor) -> Tensor:
        """Images [B, 3, S, S] in [-1, 1] -> [B, patches, PaliGemma width]."""
        return self.paligemma.model.multi_modal_projector(self.paligemma.model.vision_tower(pixels))

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.language_model.embed_tokens(tokens)

    def run(self, streams: Streams, cache: KVCache | None = None, keep_cache: bool = False
            ) -> tuple[Tensor | None, Tensor | None, KVCache]:
        """Every layer, then each stream's final norm: (prefix out, suffix out, cache). `cache`: the prefix's keys
        and values the suffix also attends to (its queries come after them); `keep_cache`: return this pass's
        rotated keys and values per layer (for a prefix-only pass)."""
        gemmas = [self.language_model, self.gemma_expert.model]
        hidden = [streams.prefix, streams.suffix]
        conds = [None, streams.cond]
        like = torch.empty(0, dtype=next(h for h in hidden if h is not None).dtype, device=streams.positions.device)
        cos, sin = self.language_model.rotary_emb(like, streams.positions)
        kept: KVCache = []
        for i in range(self.spec.paligemma.depth):
            layers: list[GemmaLayer] = [g.layers[i] for g in gemmas]
            args = (layers, hidden, conds, streams.mask, cos, sin, None if cache is None else cache[i])
            hidden, kv = run_layer(self._layer, i, self.recompute, self.training, *args)
            if keep_cache:
                kept.append(kv)
        out = [None if h is None else normalize(g.norm, h, c)[0] for g, h, c in zip(gemmas, hidden, conds,
                                                                                     strict=True)]
        return out[0], out[1], kept

    def _layer(self, layers: list[GemmaLayer], hidden: list[Tensor | None], conds: list[Tensor | None],
               mask: Tensor, cos: Tensor, sin: Tensor, past: tuple[Tensor, Tensor] | None
               ) -> tuple[list[Tensor | None], tuple[Tensor, Tensor]]:
        gates: list[Tensor | None] = [None, None]
        qs, ks, vs = [], [], []
        for s, (layer, h) in enumerate(zip(layers, hidden, strict=True)):
            if h is None:
                continue
            normed, gates[s] = normalize(layer.input_layernorm, h, conds[s])
            q, k, v = layer.self_attn.qkv(normed)
            qs.append(q), ks.append(k), vs.append(v)
        q, k = self.rotary(torch.cat(qs, dim=2), torch.cat(ks, dim=2), cos, sin)
        v = torch.cat(vs, dim=2)
        kv = (k, v)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        attended = attend(q, k, v, mask, self.scaling)
        out: list[Tensor | None] = [None, None]
        start = 0
        for s, (layer, h) in enumerate(zip(layers, hidden, strict=True)):
            if h is None:
                continue
            rows = attended[:, start : start + h.shape[1]]
            start += h.shape[1]
            x = gated(h, layer.self_attn.o_proj(rows.to(layer.self_attn.o_proj.weight.dtype)), gates[s])
            normed, gate = normalize(layer.post_attention_layernorm, x, conds[s])
            out[s] = gated(x, layer.mlp(normed), gate)
        return out, kv
