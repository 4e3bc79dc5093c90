"""Liger Kernel's Triton kernels in place of the eager norms, gated MLPs and rotary embeddings of both families
(`model.kernels=liger`; `models/kernels.py` chooses, `swap_to_liger` swaps).

Each class here subclasses the module it stands in for and overrides `forward` only, so a swap changes a module's
class and nothing else. A CUDA tensor runs Liger's kernel, anything else the eager forward (a CPU copy of a swapped
policy computes what it always did). What each kernel computes beside the eager layer:

- OFT's RMS norm (`FusedRMSNorm`: normalised and scaled in float32, rounded once) -> Liger's RMS norm in its
  "gemma" casting mode with offset 0: the same arithmetic (and the rollout engine's fast path's);
- Gemma's RMS norm (`x * (1 + w)` in float32) -> the same kernel with offset 1 (Liger's Gemma norm);
- π0.5's adaRMS norm -> Liger's modulated RMS norm (`rms(x) * (1 + scale) + shift`, scale and shift in float32),
  whose normalised rows are rounded to the activations' dtype before the modulation (eager: once, at the end);
- the SiLU and tanh-GELU gated products of the MLPs -> Liger's fused gate kernels, which keep only the two
  projections for the backward pass and recompute the activation there;
- rotary embeddings -> Liger's RoPE kernel (queries and keys in one launch, forward and backward).

Every backward here writes its own gradient tensor (`in_place=False`): a gradient autograd hands to two consumers is
never overwritten. transformers' Llama attention reads its rotary function from its module's globals, so the first
swap puts `_llama_rope` there: Liger's kernel inside a swapped attention (`LigerLlamaAttention`), transformers' own
function everywhere else.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from liger_kernel.ops import (
    LigerGELUMulFunction,
    LigerModulatedRMSNormFunction,
    LigerRMSNormFunction,
    LigerRopeFunction,
    LigerSiLUMulFunction,
)
from torch import Tensor, nn
from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm
from transformers.models.llama import modeling_llama
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP

from vla_scale.models.oft.policy import FusedRMSNorm
from vla_scale.models.pi0.backbone import PaliGemmaWithExpert
from vla_scale.models.pi0.gemma import AdaRMSNorm, rotate


def _rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float) -> Tensor:
    """`x / rms(x) * (offset + weight)` in float32, rounded once to x's dtype."""
    return LigerRMSNormFunction.apply(x, weight, eps, offset, "gemma", False, None)


def liger_rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotary embedding of q [B, H, L, hd] and k [B, KV, L, hd] with tables [B or 1, L, hd] (halves rotated, as
    transformers' `apply_rotary_pos_emb` and π0's `rotate`)."""
    return LigerRopeFunction.apply(q, k, cos, sin, None, 1, None)


class LigerLlamaRMSNorm(FusedRMSNorm):
    """`FusedRMSNorm` through Liger's RMS norm kernel."""

    def forward(self, hidden_states: Tensor) -> Tensor:
        if not hidden_states.is_cuda or hidden_states.dtype != self.weight.dtype:
            return super().forward(hidden_states)
        return _rms_norm(hidden_states, self.weight, self.variance_epsilon, 0.0)


def _gated_mlp(mlp: LlamaMLP | GemmaMLP, x: Tensor, product: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """`down(product(gate(x), up(x)))`: a gated MLP of transformers' layout with its gate product fused."""
    return mlp.down_proj(product(mlp.gate_proj(x), mlp.up_proj(x)))


class LigerLlamaMLP(LlamaMLP):
    """Llama's SiLU-gated MLP, the gate product in Liger's kernel."""

    def forward(self, x: Tensor) -> Tensor:
        if not x.is_cuda:
            return super().forward(x)
        return _gated_mlp(self, x, lambda gate, up: LigerSiLUMulFunction.apply(gate, up, 1.0, 1.0))


_ROPE_HERE: contextvars.ContextVar[bool] = contextvars.ContextVar("liger_rope_here", default=False)
"""True while a `LigerLlamaAttention` runs its forward."""

_TRANSFORMERS_ROPE = modeling_llama.apply_rotary_pos_emb


def _llama_rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
    """transformers' Llama rotary function as the swapped attention finds it (module docstring)."""
    if _ROPE_HERE.get() and q.is_cuda and not args and not kwargs:
        return liger_rope(q, k, cos, sin)
    return _TRANSFORMERS_ROPE(q, k, cos, sin, *args, **kwargs)


class LigerLlamaAttention(LlamaAttention):
    """transformers' Llama attention whose rotary embedding runs Liger's kernel."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        token = _ROPE_HERE.set(True)
        try:
            return super().forward(*args, **kwargs)
        finally:
            _ROPE_HERE.reset(token)


class LigerGemmaRMSNorm(GemmaRMSNorm):
    """Gemma's RMS norm (`x * (1 + w)` in float32) through Liger's kernel."""

    def forward(self, x: Tensor) -> Tensor:
        if not x.is_cuda:
            return super().forward(x)
        return _rms_norm(x, self.weight, self.eps, 1.0)


class LigerGemmaMLP(GemmaMLP):
    """Gemma's tanh-GELU-gated MLP, the gate product in Liger's kernel."""

    def forward(self, x: Tensor) -> Tensor:
        if not x.is_cuda:
            return super().forward(x)
        return _gated_mlp(self, x, LigerGELUMulFunction.apply)


class LigerAdaRMSNorm(AdaRMSNorm):
    """π0.5's adaRMS norm through Liger's modulated RMS norm kernel."""

    def forward(self, x: Tensor, cond: Tensor) -> tuple[Tensor, Tensor]:
        if not x.is_cuda:
            return super().forward(x, cond)
        scale, shift, gate = self.dense(cond).chunk(3, dim=-1)  # each [B, D]: one row per example's L rows
        normed = LigerModulatedRMSNormFunction.apply(x, None, scale.float(), shift.float(), self.eps, 0.0, "gemma",
                                                     False)
        return normed, gate.unsqueeze(1).to(x.dtype)


def _pi0_rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    return liger_rope(q, k, cos, sin) if q.is_cuda else rotate(q, k, cos, sin)


class LigerPaliGemmaWithExpert(PaliGemmaWithExpert):
    """π0's joint layers with the rotary embedding in Liger's kernel."""

    rotary = staticmethod(_pi0_rotary)


def _swaps(module: nn.Module) -> type[nn.Module] | None:
    """The class `module` becomes (None: it stays as it is). Exact types only: a subclass may compute otherwise."""
    kind = type(module)
    if kind is LlamaMLP:
        return LigerLlamaMLP if module.config.hidden_act == "silu" else None
    if kind is GemmaMLP:
        return LigerGemmaMLP if module.config.hidden_act == "gelu_pytorch_tanh" else None
    return {FusedRMSNorm: LigerLlamaRMSNorm, LlamaAttention: LigerLlamaAttention, GemmaRMSNorm: LigerGemmaRMSNorm,
            AdaRMSNorm: LigerAdaRMSNorm, PaliGemmaWithExpert: LigerPaliGemmaWithExpert}.get(kind)


def swap_to_liger(module: nn.Module) -> int:
    """Swap every module under `module` (itself included) that Liger has a kernel for; returns how many."""
    if modeling_llama.apply_rotary_pos_emb is _TRANSFORMERS_ROPE:
        modeling_llama.apply_rotary_pos_emb = _llama_rope
    swapped = 0
    for child in module.modules():
        liger = _swaps(child)
        if liger is not None:
            child.__class__ = liger  # the same parameters, buffers and attributes; another forward
            swapped += 1
    return swapped


def swap_to_eager(module: nn.Module) -> int:
    """Undo `swap_to_liger` under `module`: each swapped module gets back the eager class it subclasses; returns
    how many."""
    swapped = 0
    for child in module.modules():
        if is_swapped(child):
            child.__class__ = type(child).__mro__[1]
            swapped += 1
    return swapped


def is_swapped(module: nn.Module) -> bool:
    """Whether `module`'s forward is one of this module's."""
    return type(module).__module__ == __name__


__all__ = ["LigerAdaRMSNorm", "LigerGemmaMLP", "LigerGemmaRMSNorm", "LigerLlamaAttention", "LigerLlamaMLP",
           "LigerLlamaRMSNorm", "LigerPaliGemmaWithExpert", "is_swapped", "liger_rope", "swap_to_eager",
           "swap_to_liger"]
