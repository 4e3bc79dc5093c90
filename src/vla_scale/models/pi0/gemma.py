"""Gemma decoders as π0 runs them: parameters laid out as transformers' `GemmaForCausalLM`, layers run one at a time.

openpi drives its two Gemmas (PaliGemma's language model and the action expert) layer by layer from outside, so
that both attend over one sequence (`models/pi0/backbone.py`); what a layer holds is therefore all this module
defines, with transformers' parameter names (`model.layers.<i>.self_attn.q_proj.weight`, `model.norm.weight`,
`lm_head.weight`, ...), which are openpi's. Two things differ from transformers' Gemma, both openpi's patches:

- inputs are not scaled by sqrt(width) inside the model (π0 scales the prompt's token embeddings itself, and the
  image and action embeddings not at all);
- π0.5's expert replaces each RMS norm's weight by adaRMS (`AdaRMSNorm`): a linear map of the time embedding gives
  a scale, a shift and a gate per feature; the norm's output is `rms(x) * (1 + scale) + shift`, and the gate
  multiplies the branch that follows before it joins the residual stream (`x + gate * branch`).

The norm, MLP and rotary tables are transformers' own modules where they compute the same thing; the attention is
the formula openpi runs (a large negative number added to the scores where masked, softmax in float32) through
torch's scaled_dot_product_attention (`attend`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GemmaConfig
from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm, GemmaRotaryEmbedding

from vla_scale.models.pi0.spec import GemmaSpec

MASKED = -2.3819763e38
"""What openpi adds to the attention scores of a masked key (a float32 near its lowest value, so exp() gives 0)."""


def gemma_config(spec: GemmaSpec, vocab_size: int) -> GemmaConfig:
    """transformers' GemmaConfig of a spec (what the MLP and rotary modules read): tanh-approximated GELU."""
    return GemmaConfig(
        vocab_size=vocab_size, hidden_size=spec.width, intermediate_size=spec.mlp_dim,
        num_hidden_layers=spec.depth, num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=spec.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
    )


class AdaRMSNorm(nn.Module):
    """RMS norm whose scale, shift and gate come from a conditioning vector (`dense`: cond -> 3 * dim, zero init)."""

    def __init__(self, dim: int, cond_dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)
        nn.init.zeros_(self.dense.weight)

    def forward(self, x: Tensor, cond: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, L, D], cond [B, cond_dim] -> (normalised x, gate [B, 1, D])."""
        var = x.float().square().mean(dim=-1, keepdim=True)
        normed = x * torch.rsqrt(var + self.eps)
        scale, shift, gate = self.dense(cond).unsqueeze(1).chunk(3, dim=-1)
        return (normed * (1 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


def normalize(norm: nn.Module, x: Tensor, cond: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """A layer norm's output and gate: adaRMS with `cond`, else the plain RMS norm (gate None)."""
    if isinstance(norm, AdaRMSNorm):
        if cond is None:
            raise ValueError("an adaRMS norm needs its conditioning (the time embedding)")
        return norm(x, cond)
    return norm(x), None


def gated(residual: Tensor, branch: Tensor, gate: Tensor | None) -> Tensor:
    """The residual connection: `residual + branch`, the branch scaled by the adaRMS gate when there is one."""
    return residual + branch if gate is None else residual + branch * gate


def make_norm(spec: GemmaSpec, cond_dim: int) -> nn.Module:
    return AdaRMSNorm(spec.width, cond_dim, spec.rms_norm_eps) if cond_dim else GemmaRMSNorm(spec.width,
                                                                                            spec.rms_norm_eps)


class GemmaAttention(nn.Module):
    """The projections of one attention block (no bias); the attention itself runs in `backbone.py`."""

    def __init__(self, spec: GemmaSpec):
        super().__init__()
        self.head_dim = spec.head_dim
        self.q_proj = nn.Linear(spec.width, spec.num_heads * spec.head_dim, bias=False)
        self.k_proj = nn.Linear(spec.width, spec.num_kv_heads * spec.head_dim, bias=False)
        self.v_proj = nn.Linear(spec.width, spec.num_kv_heads * spec.head_dim, bias=False)
        self.o_proj = nn.Linear(spec.num_heads * spec.head_dim, spec.width, bias=False)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, L, D] -> queries [B, H, L, hd], keys and values [B, KV, L, hd]."""
        shape = (*x.shape[:-1], -1, self.head_dim)
        return tuple(p(x).view(shape).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))  # type: ignore[return-value]


class GemmaLayer(nn.Module):
    """One decoder layer: pre-norm attention and pre-norm gated-GELU MLP (adaRMS norms when `cond_dim` > 0)."""

    def __init__(self, spec: GemmaSpec, config: GemmaConfig, cond_dim: int):
        super().__init__()
        self.self_attn = GemmaAttention(spec)
        self.mlp = GemmaMLP(config)
        self.input_layernorm = make_norm(spec, cond_dim)
        self.post_attention_layernorm = make_norm(spec, cond_dim)


class GemmaModel(nn.Module):
    """Token embedding (absent for the expert, which never reads tokens), layers, final norm, rotary tables."""

    def __init__(self, spec: GemmaSpec, vocab_size: int, cond_dim: int = 0, embeds_tokens: bool = True):
        super().__init__()
        config = gemma_config(spec, vocab_size)
        # row 0 (PaliGemma's pad id) gets no gradient, as in transformers' Gemma
        self.embed_tokens = nn.Embedding(vocab_size, spec.width, padding_idx=0) if embeds_tokens else None
        self.layers = nn.ModuleList(GemmaLayer(spec, config, cond_dim) for _ in range(spec.depth))
        self.norm = make_norm(spec, cond_dim)
        self.rotary_emb = GemmaRotaryEmbedding(config)


class GemmaForCausalLM(nn.Module):
    """`model` and `lm_head`, transformers' layout. π0 never runs either LM head; they are kept (frozen) so that
    openpi's checkpoints load key for key. With `tie` the head is the token embedding, as in PaliGemma."""

    def __init__(self, spec: GemmaSpec, vocab_size: int, cond_dim: int = 0, embeds_tokens: bool = True,
                 tie: bool = False):
        super().__init__()
        self.model = GemmaModel(spec, vocab_size, cond_dim, embeds_tokens)
        self.lm_head = nn.Linear(spec.width, vocab_size, bias=False)
        if tie and self.model.embed_tokens is not None:
            self.lm_head.weight = self.model.embed_tokens.weight
        else:
            self.lm_head.requires_grad_(False)


def rotate(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotary position embedding of queries and keys [B, heads, L, hd] with tables [B, L, hd] (halves rotated)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def turned(x: Tensor) -> Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    return q * cos + turned(q) * sin, k * cos + turned(k) * sin


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scaling: float) -> Tensor:
    """Grouped-query attention: q [B, H, Lq, hd], k/v [B, KV, Lk, hd], `mask` additive [B, 1, Lq, Lk] (0 or
    MASKED) -> [B, Lq, H * hd]. openpi's eager formula (scores + mask, softmax in float32) through torch's fused
    kernel, which takes the keys' heads as they are (no copy per query head) and never writes the scores out; the
    softmax is float32 inside it too."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), scale=scaling,
                                         enable_gqa=q.shape[1] != k.shape[1]).transpose(1, 2)
    return out.reshape(*out.shape[:2], -1)
