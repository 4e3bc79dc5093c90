"""The rollout engine's fast forward pass: the same bin logits as `OFTPolicy.action_logits`, computed with less work.

What differs from the policy's own (plain) forward, and why each keeps the function the same:

- **Trimmed text.** `Processor` pads every prompt to `max_text_len`; the plain pass runs all those pad positions.
  Here the prompt columns are cut to the longest prompt of the batch first. Examples are right-padded and pads are
  masked keys whose own outputs are never read, so no real position changes its inputs or its rotary position.
- **Free functions per block.** A ViT block and a Llama decoder layer are written as functions of their weights,
  so `torch.compile` traces each kind of block once (batch and sequence sizes dynamic) and every layer reuses the
  compiled code; the compiled code fuses each norm, rotary embedding, activation and residual add into one pass.
  The arithmetic follows transformers' Llama (RMSNorm in float32, cast back before the weight) and the towers in
  `models/vision.py` (same ops, same order).
- **Only what is read.** The last decoder layer computes keys and values for all positions but queries, output
  projection and MLP only for the rows whose logits are read (one per action slot); the final norm runs on those rows
  and the LM head multiplies only its `n_bins` action rows.
- **Aligned mask.** The additive attention mask is allocated with its key axis padded to a multiple of 16 and then
  sliced, so the fused SDPA kernels take it as is instead of padding a copy of it in every layer.

Without `compile` the same functions run eagerly (the CPU equivalence test runs them so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vla_scale.models.policy import OFTPolicy
from vla_scale.models.vision import ViT

Weights = tuple[Tensor | None, ...]


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' LlamaRMSNorm: normalise in float32, cast back, then scale."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _vit_act(x: Tensor, act: str) -> Tensor:
    if act == "gelu":
        return F.gelu(x)
    if act == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    return x * torch.sigmoid(1.702 * x)  # quick_gelu


def vit_block(x: Tensor, w: Weights, heads: int, eps: float, act: str) -> Tensor:
    """One pre-norm ViT block (`models.vision.Block`); w = (norm1 w, b, qkv w, b, proj w, b, norm2 w, b,
    fc1 w, b, fc2 w, b, layer-scale 1, layer-scale 2), the layer scales None when the tower has none."""
    n1w, n1b, qkv_w, qkv_b, proj_w, proj_b, n2w, n2b, fc1_w, fc1_b, fc2_w, fc2_b, ls1, ls2 = w
    b, n, d = x.shape
    h = F.layer_norm(x, (d,), n1w, n1b, eps)
    q, k, v = F.linear(h, qkv_w, qkv_b).reshape(b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    h = F.linear(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d), proj_w, proj_b)
    x = x + (h if ls1 is None else h * ls1)
    h = F.linear(_vit_act(F.linear(F.layer_norm(x, (d,), n2w, n2b, eps), fc1_w, fc1_b), act), fc2_w, fc2_b)
    return x + (h if ls2 is None else h * ls2)


def _attention(h_q: Tensor, h_kv: Tensor, w: Weights, cos_q: Tensor, sin_q: Tensor, cos: Tensor, sin: Tensor,
               bias: Tensor, heads: int, kv_heads: int) -> Tensor:
    """Llama self-attention of the query rows `h_q` [B, Q, D] over the positions `h_kv` [B, T, D] (already normed)."""
    _, wq, bq, wk, bk, wv, bv, wo, bo = w[:9]
    b, nq, _ = h_q.shape
    t = h_kv.shape[1]
    q = F.linear(h_q, wq, bq).view(b, nq, heads, -1).transpose(1, 2)
    k = F.linear(h_kv, wk, bk).view(b, t, kv_heads, -1).transpose(1, 2)
    v = F.linear(h_kv, wv, bv).view(b, t, kv_heads, -1).transpose(1, 2)
    q = q * cos_q.unsqueeze(1) + _rotate_half(q) * sin_q.unsqueeze(1)
    k = k * cos.unsqueeze(1) + _rotate_half(k) * sin.unsqueeze(1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=kv_heads != heads)
    return F.linear(out.transpose(1, 2).reshape(b, nq, -1), wo, bo)


def _mlp(x: Tensor, w: Weights, eps: float) -> Tensor:
    ln2, wg, bg, wu, bu, wd, bd = w[9:]
    h = _rms_norm(x, ln2, eps)
    return x + F.linear(F.silu(F.linear(h, wg, bg)) * F.linear(h, wu, bu), wd, bd)


def llama_layer(x: Tensor, cos: Tensor, sin: Tensor, bias: Tensor, w: Weights, heads: int, kv_heads: int,
                eps: float) -> Tensor:
    """One Llama decoder layer over all positions; w = (input norm, q, q bias, k, k bias, v, v bias, o, o bias,
    post-attention norm, gate, gate bias, up, up bias, down, down bias)."""
    h = _rms_norm(x, w[0], eps)
    x = x + _attention(h, h, w, cos, sin, cos, sin, bias, heads, kv_heads)
    return _mlp(x, w, eps)


def llama_last_layer(x: Tensor, rows: Tensor, cos: Tensor, sin: Tensor, bias_rows: Tensor, w: Weights, heads: int,
                     kv_heads: int, eps: float) -> Tensor:
    """The last decoder layer, its output only at `rows` int64[B, K]: keys and values from every position."""
    h = _rms_norm(x, w[0], eps)
    index = rows.unsqueeze(-1).expand(-1, -1, x.shape[-1])
    x_rows = x.gather(1, index)
    cos_rows, sin_rows = cos[0][rows], sin[0][rows]
    x_rows = x_rows + _attention(h.gather(1, index), h, w, cos_rows, sin_rows, cos, sin, bias_rows, heads, kv_heads)
    return _mlp(x_rows, w, eps)


def _linear(module: Any) -> tuple[Tensor, Tensor | None]:
    return module.weight, module.bias


def _vit_weights(block: Any) -> Weights:
    scales = tuple(getattr(block, name).scale_factor if hasattr(getattr(block, name), "scale_factor") else None
                   for name in ("ls1", "ls2"))
    return (block.norm1.weight, block.norm1.bias, *_linear(block.attn.qkv), *_linear(block.attn.proj),
            block.norm2.weight, block.norm2.bias, *_linear(block.mlp.fc1), *_linear(block.mlp.fc2), *scales)


def _llama_weights(layer: Any) -> Weights:
    attn, mlp = layer.self_attn, layer.mlp
    return (layer.input_layernorm.weight, *_linear(attn.q_proj), *_linear(attn.k_proj), *_linear(attn.v_proj),
            *_linear(attn.o_proj), layer.post_attention_layernorm.weight, *_linear(mlp.gate_proj),
            *_linear(mlp.up_proj), *_linear(mlp.down_proj))


def attention_bias(valid: Tensor, causal: bool, dtype: torch.dtype) -> Tensor:
    """Additive mask [B, 1, T, T] (pad keys hidden; later positions too when causal), its rows 16-aligned in memory."""
    b, t = valid.shape
    allowed = valid[:, None, None, :].expand(-1, 1, t, -1)
    if causal:
        allowed = allowed & torch.ones(t, t, dtype=torch.bool, device=valid.device).tril()
    padded = torch.empty(b, 1, t, -(-t // 16) * 16, dtype=dtype, device=valid.device)[..., :t]
    return padded.copy_(torch.where(allowed, 0.0, torch.finfo(dtype).min))


def trim_text(input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Cut the right padding shared by every prompt of the batch (the mask may live on the host: no sync then)."""
    longest = int(attention_mask.sum(dim=1).max())
    return input_ids[:, :longest], attention_mask[:, :longest]


class FastForward:
    """`policy.action_logits` (bins only) the fast way; `compile=True` runs the blocks through `torch.compile`."""

    def __init__(self, policy: OFTPolicy, compile: bool = False):
        if not self.supports(policy):
            raise ValueError("the fast forward implements Llama's silu MLP and bin logits; this policy has "
                             f"hidden_act={policy.language_model.config.hidden_act!r}")
        self.policy = policy
        self.compiled = compile
        config = policy.language_model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.causal = policy.spec.attention == "causal"
        wrap: Callable[[Callable], Callable] = (lambda f: torch.compile(f)) if compile else (lambda f: f)
        self._vit_block, self._layer, self._last = wrap(vit_block), wrap(llama_layer), wrap(llama_last_layer)

    @staticmethod
    def supports(policy: OFTPolicy) -> bool:
        return policy.language_model.config.hidden_act == "silu"

    def _dynamic(self, *dims: tuple[Tensor, int]) -> None:
        """Batch and sequence axes are dynamic from the first call (one compile serves every batch size)."""
        if self.compiled:
            for tensor, dim in dims:
                torch._dynamo.maybe_mark_dynamic(tensor, dim)

    def tower(self, vit: ViT, pixels: Tensor) -> Tensor:
        x = vit.norm_pre(vit._prefix_and_positions(vit.patch_embed(pixels)))
        spec = vit.spec
        for block in vit.blocks[: spec.blocks_run]:
            self._dynamic((x, 0))
            x = self._vit_block(x, _vit_weights(block), spec.num_heads, spec.norm_eps, spec.act)
        if spec.norm_features:
            x = vit.norm(x)
        return x[:, spec.num_prefix_tokens :]

    def vision(self, pixel_values: Tensor) -> Tensor:
        """`VisionBackbone.forward` with the towers' blocks run by `vit_block`."""
        backbone = self.policy.vision_backbone
        batch, n = pixel_values.shape[0], backbone.num_images(pixel_values)
        images = pixel_values.unflatten(1, (n, backbone.channels_per_image)).flatten(0, 1)
        features = self.tower(backbone.featurizer, images[:, :3])
        if backbone.fused_featurizer is not None:
            features = torch.cat([features, self.tower(backbone.fused_featurizer, images[:, 3:])], dim=2)
        return features.reshape(batch, n * features.shape[1], features.shape[2])

    @torch.no_grad()
    def __call__(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor,
                 proprio: Tensor | None = None) -> Tensor:
        """Bin logits float32[B, chunk*action_dim, n_bins], as `OFTPolicy.action_logits` gives them."""
        policy, spec = self.policy, self.policy.spec
        prefix = policy.prefix_embeddings(pixel_values, proprio, self.vision)
        x, valid, rows = policy._sequence(prefix, input_ids, attention_mask)
        llm = policy.language_model.model
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        cos, sin = llm.rotary_emb(x, positions)
        bias = attention_bias(valid, self.causal, x.dtype)
        layers = llm.layers[: llm.config.num_hidden_layers]
        for layer in layers[:-1]:
            self._dynamic((x, 0), (x, 1), (cos, 1), (sin, 1), (bias, 0), (bias, 2), (bias, 3))
            weights = _llama_weights(layer)
            x = self._layer(x, cos, sin, bias, weights, self.heads, self.kv_heads, self.eps)
        bias_rows = bias.gather(2, rows[:, None, :, None].expand(-1, 1, -1, bias.shape[-1]))
        self._dynamic((x, 0), (x, 1), (rows, 0), (cos, 1), (sin, 1), (bias_rows, 0), (bias_rows, 3))
        weights = _llama_weights(layers[-1])
        hidden = self._last(x, rows, cos, sin, bias_rows, weights, self.heads, self.kv_heads, self.eps)
        hidden = llm.norm(hidden)
        begin = spec.action_token_begin
        head = policy.language_model.lm_head
        bins = head.weight[begin : begin + spec.n_bins]
        logits = F.linear(hidden, bins, None if head.bias is None else head.bias[begin : begin + spec.n_bins])
        return logits.float()
