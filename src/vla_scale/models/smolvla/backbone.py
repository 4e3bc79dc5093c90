"""SmolVLM and the action expert run side by side, layer by layer, as LeRobot's `SmolVLMWithExpertModel` runs them.

The sequence is a prefix (the VLM's tokens: images, prompt, state) and a suffix (the expert's action tokens). Each
VLM layer i has an expert layer beside it (`SmolVLASpec.expert_layer`: every layer, or every k-th when the expert
is shallower; where it has none the suffix passes the layer unchanged). Layers are of two kinds:

- joint (every `self_attn_every_n_layers`-th, or all with `attention_mode="self_attn"`): each stream normalises and
  projects its own tokens with its own weights; queries, keys and values of both are concatenated along the
  sequence and attend together under one mask, rotated by one table of positions;
- cross: the prefix attends to itself alone; the expert's queries (rotated by their own positions, counted from 0)
  attend only to this layer's prefix keys and values, which the expert's `k_proj` and `v_proj` map first (the keys
  as rotated for the VLM, not rotated again).

Both kinds leave the prefix's result independent of the suffix, so one function serves the three passes:
both streams at once (the training loss), the prefix alone keeping every layer's rotated keys and values (the cache
the sampler computes once per observation; every layer is then a prefix self-attention), and the suffix alone
attending to that cache (each denoising step: a joint layer appends its keys to the cached ones, a cross layer
reads them). After each attention every stream goes through its own output projection, residual, norm, MLP and
residual, and at the end through its own final norm.

The attention is LeRobot's formula (scores scaled by head_dim^-0.5, masked keys set to a large negative number,
softmax in float32) through torch's fused kernel; the rotary embedding is LeRobot's (float32, halves rotated,
wavelength `text.rope_theta`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vla_scale.models.flow.policy import PrefixCache, run_layer
from vla_scale.models.smolvla.spec import SmolVLASpec
from vla_scale.models.smolvla.vlm import DecoderLayer, Expert, SmolVLM

Rotation = tuple[Tensor, Tensor]
"""cos and sin [B, 1, L, head_dim / 2] of the rotary embedding at L positions."""


def rotation(positions: Tensor, head_dim: int, theta: float) -> Rotation:
    """The rotary tables of positions [B, L] (angle = position / theta^(2i / head_dim), float32)."""
    exponents = (2.0 / head_dim) * torch.arange(head_dim // 2, dtype=torch.float32, device=positions.device)
    angles = positions[..., None].to(torch.float32) / (theta**exponents)[None, None, :]
    return torch.cos(angles)[:, None], torch.sin(angles)[:, None]


def rotate(x: Tensor, table: Rotation) -> Tensor:
    """x [B, heads, L, head_dim] rotated by a table of L positions: the halves (x1, x2) become
    (x1 cos - x2 sin, x2 cos + x1 sin), in float32, returned in x's dtype."""
    cos, sin = table
    half = x.shape[-1] // 2
    wide = x.to(torch.float32)
    x1, x2 = wide[..., :half], wide[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Grouped-query attention: q [B, H, Lq, hd], k/v [B, KV, Lk, hd], additive mask [B, 1, Lq, Lk] ->
    [B, Lq, H * hd]."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), scale=q.shape[-1] ** -0.5,
                                         enable_gqa=q.shape[1] != k.shape[1]).transpose(1, 2)
    return out.reshape(*out.shape[:2], -1)


def _keys_for_expert(layer: DecoderLayer, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """A cross layer's keys and values: the VLM's [B, KV, P, hd] through the expert's k_proj / v_proj."""
    attn = layer.self_attn

    def mapped(x: Tensor, proj: nn.Linear) -> Tensor:
        flat = x.transpose(1, 2).flatten(2).to(proj.weight.dtype)
        return attn.heads(proj(flat))

    return mapped(keys, attn.k_proj), mapped(values, attn.v_proj)


def _after_attention(layer: DecoderLayer, hidden: Tensor, attended: Tensor) -> Tensor:
    """Output projection, residual, post-attention norm, MLP, residual."""
    x = hidden + layer.self_attn.o_proj(attended.to(layer.self_attn.o_proj.weight.dtype))
    return x + layer.mlp(layer.post_attention_layernorm(x))


@dataclass
class Streams:
    """What one pass runs: the prefix and/or suffix embeddings, the additive mask over [queries, all keys] (the
    cached prefix's first) and the queries' positions."""

    prefix: Tensor | None  # [B, P, VLM width]
    suffix: Tensor | None  # [B, S, expert width]
    mask: Tensor  # [B, 1, queries, keys]: 0 where a query sees a key, flow.policy.MASKED elsewhere
    positions: Tensor  # [B, queries]


class SmolVLMWithExpert(nn.Module):
    """The VLM (`vlm`) and the expert (`lm_expert`), run jointly (module docstring)."""

    def __init__(self, spec: SmolVLASpec, zero3_init: bool = False):
        super().__init__()
        self.spec = spec
        self.vlm = SmolVLM(spec, zero3_init)
        self.lm_expert = Expert(spec)
        self.recompute = 0
        """Layers that keep only their inputs in training and recompute in the backward pass: the first `recompute`
        (-1: all; `SmolVLAPolicy.recompute_layers`)."""

    @property
    def text_model(self) -> nn.Module:
        return self.vlm.model.text_model

    def embed_image(self, pixels: Tensor) -> Tensor:
        return self.vlm.embed_image(pixels)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.text_model.embed_tokens(tokens)

    def run(self, streams: Streams, cache: PrefixCache | None = None, keep_cache: bool = False
            ) -> tuple[Tensor | None, Tensor | None, PrefixCache]:
        """Every layer, then each stream's final norm: (prefix out, suffix out, cache). `cache`: the prefix's keys
        and values the suffix attends to (its queries come after them); `keep_cache`: return this pass's rotated
        keys and values per layer (for a prefix-only pass)."""
        hidden: list[Tensor | None] = [streams.prefix, streams.suffix]
        tables = self._tables(streams)
        kept: PrefixCache = []
        for i in range(self.spec.num_vlm_layers):
            args = (i, hidden, streams.mask, tables, None if cache is None else cache[i])
            hidden, kv = run_layer(self._layer, i, self.recompute, self.training, *args)
            if keep_cache:
                kept.append(kv)
        norms = [self.text_model.norm, self.lm_expert.norm]
        out = [None if h is None else norm(h) for norm, h in zip(norms, hidden, strict=True)]
        return out[0], out[1], kept

    def _tables(self, streams: Streams) -> dict[str, Rotation]:
        """The rotary tables a pass needs: of the queries' positions, and of the suffix's counted from 0."""
        text = self.spec.text
        tables = {"queries": rotation(streams.positions, text.head_dim, text.rope_theta)}
        if streams.suffix is not None:
            own = streams.positions[:, -streams.suffix.shape[1] :]
            own = own - own.min(dim=1, keepdim=True).values
            tables["suffix"] = rotation(own, text.head_dim, text.rope_theta)
        return tables

    def _layer(self, i: int, hidden: list[Tensor | None], mask: Tensor, tables: dict[str, Rotation],
               past: tuple[Tensor, Tensor] | None) -> tuple[list[Tensor | None], tuple[Tensor, Tensor]]:
        j = self.spec.expert_layer(i)
        layers = [self.text_model.layers[i], None if j is None else self.lm_expert.layers[j]]
        if hidden[1] is not None and self.spec.cross_layer(i):
            return self._cross_layer(layers, hidden, mask, tables, past)
        return self._joint_layer(layers, hidden, mask, tables, past)

    def _joint_layer(self, layers: list[DecoderLayer | None], hidden: list[Tensor | None], mask: Tensor,
                     tables: dict[str, Rotation], past: tuple[Tensor, Tensor] | None
                     ) -> tuple[list[Tensor | None], tuple[Tensor, Tensor]]:
        """Both streams' tokens in one attention (a stream without a layer here passes it unchanged)."""
        running = [s for s in (0, 1) if hidden[s] is not None and layers[s] is not None]
        qs, ks, vs = [], [], []
        for s in running:
            attn = layers[s].self_attn
            normed = layers[s].input_layernorm(hidden[s]).to(attn.q_proj.weight.dtype)
            qs.append(attn.heads(attn.q_proj(normed)))
            ks.append(attn.heads(attn.k_proj(normed))), vs.append(attn.heads(attn.v_proj(normed)))
        out = list(hidden)
        if not running:
            return out, (torch.empty(0), torch.empty(0))
        q, k, v = torch.cat(qs, dim=2), torch.cat(ks, dim=2), torch.cat(vs, dim=2)
        rows = q.shape[2]
        cos, sin = tables["queries"]
        table = (cos[:, :, :rows], sin[:, :, :rows])
        q, k = rotate(q, table), rotate(k, table)
        kv = (k, v)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        keys = k.shape[2]
        attended = attend(q, k, v, mask[:, :, :rows, :keys] if past is None else mask)
        start = 0
        for s in running:
            count = hidden[s].shape[1]
            out[s] = _after_attention(layers[s], hidden[s], attended[:, start : start + count])
            start += count
        return out, kv

    def _cross_layer(self, layers: list[DecoderLayer | None], hidden: list[Tensor | None], mask: Tensor,
                     tables: dict[str, Rotation], past: tuple[Tensor, Tensor] | None
                     ) -> tuple[list[Tensor | None], tuple[Tensor, Tensor]]:
        """The prefix attends to itself; the expert's queries to the prefix's keys and values through its own
        projections (from the cache when the prefix is not in this pass)."""
        out = list(hidden)
        prefix, suffix = hidden
        if prefix is not None:
            vlm = layers[0]
            attn = vlm.self_attn
            normed = vlm.input_layernorm(prefix).to(attn.q_proj.weight.dtype)
            length = prefix.shape[1]
            cos, sin = tables["queries"]
            table = (cos[:, :, :length], sin[:, :, :length])
            q = rotate(attn.heads(attn.q_proj(normed)), table)
            k = rotate(attn.heads(attn.k_proj(normed)), table)
            v = attn.heads(attn.v_proj(normed))
            out[0] = _after_attention(vlm, prefix, attend(q, k, v, mask[:, :, :length, :length]))
            past = (k, v)
        assert past is not None and suffix is not None
        expert = layers[1]
        if expert is not None:
            attn = expert.self_attn
            normed = expert.input_layernorm(suffix).to(attn.q_proj.weight.dtype)
            q = rotate(attn.heads(attn.q_proj(normed)), tables["suffix"])
            k, v = _keys_for_expert(expert, *past)
            to_prefix = mask[:, :, -suffix.shape[1] :, : k.shape[2]]
            out[1] = _after_attention(expert, suffix, attend(q, k, v, to_prefix))
        return out, past
