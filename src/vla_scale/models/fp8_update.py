"""FP8 (e4m3) matrix products in the actor's forward and backward (`deepspeed.update_precision`).

The policy's transformer blocks' linear layers (every `nn.Linear` inside a `layers.<i>` or `blocks.<i>` module list:
the Llama or Gemma layers' q, k, v, o, gate, up and down projections, the vision blocks' qkv, proj, fc1 and fc2;
a LoRA layer's frozen base product too, its adapters staying as they are) have their class swapped in place for one
whose forward multiplies through `Fp8LinearFunction`. Embeddings, norms, the projectors, the LM head and the
action heads keep their products. The parameters are the same objects: master weights and optimizer states are
untouched, and under ZeRO-3 the swapped module's hooks still gather its weight before its forward and again before
its backward, where the function reads the gathered weight (it keeps the weight and the input for the backward, as
a plain linear layer does, and quantises them again there).

Each of the three products of a linear layer y = x Wᵀ contracts over another axis, and every operand is quantised
to e4m3 along the axis its product contracts over, with one float32 scale per row of the quantised matrix (its
largest magnitude / 448, `models/fp8.quantise_rows`; the axiswise scaling of torchao's rowwise float8 recipe and of
DeepSeek-V3's fine-grained FP8 training, here with a whole row as the group):

- forward, y = x Wᵀ: x per token (row), W per output channel;
- input gradient, grad_x = g W: g per token, W per input channel (W's columns, over the output channels);
- weight gradient, grad_W = gᵀ x: g per output channel and x per input channel, each over the tokens (padded with
  zero tokens to a multiple of 16, what FP8 tensor cores take).

The gradient g is e4m3 too, not e5m2: a scale per row already spans the gradient's range across rows, and within
one row e4m3's extra mantissa bit halves the rounding error where e5m2's wider exponent would only keep values below
1/2**9 of the row's largest (what torchao's rowwise recipe and DeepSeek-V3 chose for the same reason; it is also the
only format torch's row-scaled FP8 kernel takes for both operands). The forward accumulates in the tensor cores'
fast mode; both gradients promote their partial sums to float32 as they go (`use_fast_accum=False`): the weight
gradient's contraction runs over every token of a micro-batch, thousands of products.

On CUDA the products run through `torch._scaled_mm` with the row scales in its epilogue (output in the activations'
dtype, bf16), and each quantisation (the amax, the scaling, the cast, and for the weight gradient's operands the
transpose and the padding) is one compiled function (`models/fp8.fused`). `fp8_emulated` runs the same
quantisation and multiplies the dequantised values in float32 on any device: what the CPU tests and dry runs check;
it is chosen by name, never as a fallback (`update_problem`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vla_scale.models.fp8 import dequantise, fp8_problem, fused, quantise_rows
from vla_scale.models.lora import LoRALinear

UPDATE_PRECISIONS = ("bf16", "fp8", "fp8_emulated")
"""The actor's matrix products (`deepspeed.update_precision`): the weights' own dtype, e4m3 on FP8 tensor cores, or
the same e4m3 quantisation multiplied in float32 (any device)."""

KEY = "deepspeed.update_precision"
BLOCK_LISTS = ("layers", "blocks")
"""Module lists whose entries are transformer blocks: their linear layers multiply in FP8."""
ALIGN = 16  # FP8 tensor cores take matrices whose sides are multiples of 16
GRADIENT_FAST_ACCUM = False
"""Whether the two gradients' products accumulate in the tensor cores' fast mode, as the forward's do (module
docstring: they promote their partial sums to float32 as they go)."""


def update_problem(precision: str, device: torch.device, bf16: bool) -> str | None:
    """Why the actor cannot multiply in `precision` on `device` (None when it can); `bf16`: deepspeed.bf16."""
    if precision not in UPDATE_PRECISIONS:
        return f"{KEY}={precision!r}: choose one of {', '.join(UPDATE_PRECISIONS)}"
    if precision != "fp8":
        return None
    problem = fp8_problem(device, key=f"{KEY}=fp8", fix=f"use {KEY}=bf16 (or fp8_emulated to check the arithmetic "
                                                        "in float32)")
    if problem is None and not bf16:
        return (f"{KEY}=fp8 writes the products in bf16 (torch's row-scaled FP8 kernel), and the actor trains in "
                "float32: set deepspeed.bf16=true")
    return problem


def _rows(t: Tensor) -> tuple[Tensor, Tensor]:
    """e4m3 rows of t [rows, cols] (row-major) and their float32 scales [rows]."""
    data, scale = quantise_rows(t)
    return data.contiguous(), scale


def _token_rows(t: Tensor, align: int) -> tuple[Tensor, Tensor]:
    """`_rows` of t [tokens, features] taken over the tokens: rows [features, tokens'], tokens' padded with zero
    tokens to a multiple of `align` (zeros add nothing to the product and change no row's largest magnitude)."""
    rows = t.t()
    pad = -rows.shape[1] % align
    return _rows(F.pad(rows, (0, pad)) if pad else rows)


def _quantised(t: Tensor, emulate: bool) -> tuple[Tensor, Tensor]:
    """`_rows(t)`, fused on a GPU (the same arithmetic elsewhere: the CPU checks of the CUDA path run it eager)."""
    return fused(_rows)(t) if t.is_cuda and not emulate else _rows(t)


def _quantised_over_tokens(t: Tensor, emulate: bool) -> tuple[Tensor, Tensor]:
    """`_token_rows(t)`, padded for the tensor cores unless `emulate`, fused on a GPU."""
    align = 1 if emulate else ALIGN
    return fused(_token_rows)(t, align) if t.is_cuda and not emulate else _token_rows(t, align)


def _product(a: Tensor, scale_a: Tensor, b: Tensor, scale_b: Tensor, out_dtype: torch.dtype, fast: bool,
             emulate: bool) -> Tensor:
    """(a * scale_a) @ (b * scale_b)ᵀ for rows quantised along the contraction: a [M, K], b [N, K] -> [M, N]."""
    if emulate:
        return (dequantise(a, scale_a) @ dequantise(b, scale_b).t()).to(out_dtype)
    return torch._scaled_mm(a, b.t(), scale_a=scale_a.unsqueeze(1), scale_b=scale_b.unsqueeze(0),
                            out_dtype=out_dtype, use_fast_accum=fast)


class Fp8LinearFunction(torch.autograd.Function):
    """`F.linear(x, weight, bias)` with its three products in e4m3 (module docstring); gradients in the dtypes of
    the input and the weight."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, emulate: bool) -> Tensor:  # type: ignore[override]
        rows = x.reshape(-1, x.shape[-1])
        y = _product(*_quantised(rows, emulate), *_quantised(weight, emulate), x.dtype, True, emulate)
        ctx.save_for_backward(x, weight)
        ctx.emulate, ctx.bias_dtype = emulate, None if bias is None else bias.dtype
        y = y.view(*x.shape[:-1], weight.shape[0])
        return y if bias is None else y + bias

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(*_quantised(g, ctx.emulate), *_quantised(weight.t(), ctx.emulate), x.dtype,
                              GRADIENT_FAST_ACCUM, ctx.emulate).view(x.shape)
        if ctx.needs_input_grad[1]:
            rows = x.reshape(-1, x.shape[-1])
            grad_w = _product(*_quantised_over_tokens(g, ctx.emulate), *_quantised_over_tokens(rows, ctx.emulate),
                              weight.dtype, GRADIENT_FAST_ACCUM, ctx.emulate)
        if ctx.needs_input_grad[2]:
            grad_b = g.sum(0).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None


def fp8_linear(x: Tensor, weight: Tensor, bias: Tensor | None, emulate: bool) -> Tensor:
    return Fp8LinearFunction.apply(x, weight, bias, emulate)


class Fp8Linear(nn.Linear):
    """A linear layer whose products run in e4m3 (`fp8_emulate`: in float32 on the dequantised values)."""

    fp8_emulate: bool

    def forward(self, x: Tensor) -> Tensor:
        return fp8_linear(x, self.weight, self.bias, self.fp8_emulate)


class Fp8LoRALinear(LoRALinear):
    """A LoRA layer whose frozen base product runs in e4m3; the adapters' small products stay in their dtype."""

    fp8_emulate: bool

    def forward(self, x: Tensor) -> Tensor:
        return (fp8_linear(x, self.weight, self.bias, self.fp8_emulate)
                + self.lora_B(self.lora_A(x)) * self.lora_scaling)


SWAPS: dict[type[nn.Module], type[nn.Module]] = {nn.Linear: Fp8Linear, LoRALinear: Fp8LoRALinear}


def in_block(path: str) -> bool:
    """Whether the module at `path` lies inside an entry of a transformer blocks' list (`layers.3.mlp.up_proj`)."""
    parts = path.split(".")
    return any(name in BLOCK_LISTS and index.isdigit() for name, index in zip(parts, parts[1:], strict=False))


def block_linears(policy: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The linear layers `use_update_precision` swaps (module docstring), in module order, swapped or not."""
    swappable = set(SWAPS) | set(SWAPS.values())
    return [(path, m) for path, m in policy.named_modules() if type(m) in swappable and in_block(path)]


def use_update_precision(policy: nn.Module, precision: str, device: torch.device, bf16: bool) -> int:
    """Make the policy's block linear layers multiply in `precision` (bf16: their own class back); how many layers
    multiply in FP8. Refuses, before any product, a precision the device cannot run and (on tensor cores) a matrix
    whose sides are not multiples of 16, by name."""
    problem = update_problem(precision, device, bf16)
    if problem:
        raise ValueError(problem)
    layers = block_linears(policy)
    if precision == "fp8":
        for path, m in layers:
            shape = tuple(getattr(m.weight, "ds_shape", m.weight.shape))
            if shape[0] % ALIGN or shape[1] % ALIGN:
                raise ValueError(f"{KEY}=fp8 cannot multiply {path} {shape} on FP8 tensor cores (both sides must be "
                                 f"multiples of {ALIGN}); use {KEY}=bf16 for this policy")
    eager = {fp8: plain for plain, fp8 in SWAPS.items()}
    for _, m in layers:
        plain = eager.get(type(m), type(m))
        if precision == "bf16":
            m.__class__ = plain
        else:
            m.__class__ = SWAPS[plain]
            m.fp8_emulate = precision == "fp8_emulated"
    return 0 if precision == "bf16" else len(layers)
