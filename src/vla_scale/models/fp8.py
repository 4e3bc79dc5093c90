"""FP8 (e4m3) matrix products for the rollout engine: weights quantised per output channel, activations per row.

With `rollout.precision=fp8` the engine keeps the bf16 weights the sync delivered (the checksum is taken on them)
and, before the first decode after a sync, has the family's decoder quantise its weight matrices (`fp8_weights`; OFT's
ViT blocks and Llama decoder layers: `models/oft/fp8.py`), each into an `Fp8Matrix`: e4m3 values and one float32
scale per output channel (row), the row's largest magnitude / 448.
The fast forward quantises each product's input per row the same way, inside the compiled function that produces it
(the norm, the SiLU product), and multiplies with `torch._scaled_mm`, which applies both scales in its epilogue and
writes bf16. Norms, attention, the projector, the LM head (the bin logits) and the log-probs stay as they are.

Per-channel and per-row scales cost the same as one scale per tensor in `_scaled_mm` and follow the spread of
magnitudes across a layer's rows, so one outlier row does not flatten the others.

`emulate=True` runs the same quantisation and multiplies the dequantised values in float32: what the CPU tests check
(scales, saturation, the sync-then-quantise order) without FP8 tensor cores. It is chosen explicitly, never as a
fallback: `fp8_problem` names a device that cannot multiply FP8 and the engine refuses it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import torch
from torch import Tensor

PRECISIONS = ("bf16", "fp8")
"""The rollout engine's weight precisions (`rollout.precision`): its own dtype (bf16 on the GPU), or FP8 weights with
per-channel scales (this module)."""

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite e4m3 value
MIN_SCALE = 1e-12  # an all-zero row keeps a finite scale and quantises to zeros
FP8_CAPABILITY = (8, 9)  # Ada and Hopper: the first CUDA devices with FP8 tensor cores
F = TypeVar("F", bound=Callable[..., object])


class Fp8Matrix(NamedTuple):
    """A weight [out, in] as e4m3 values and float32 scales [out]: row i is approximately data[i] * scale[i]."""

    data: Tensor
    scale: Tensor

    def rows(self, start: int, stop: int) -> Fp8Matrix:
        """Output channels start..stop (a view: the q, k or v part of a stacked q-k-v matrix)."""
        return Fp8Matrix(self.data[start:stop], self.scale[start:stop])


def quantise_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """e4m3 values and float32 scales [rows] of x [rows, cols]: each row scaled so its largest magnitude is 448."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=MIN_SCALE) / E4M3_MAX
    data = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return data, scale.squeeze(-1)


@functools.cache
def fused(fn: F) -> F:
    """`fn` (a quantisation) compiled once per process: the amax, the scaling and the cast (and any transpose or
    padding before them) fused into a kernel or two that read the operand once, where eager runs each as a pass of
    its own over it, passes that cost more than the FP8 products save (docs/performance.md). For CUDA tensors; the
    arithmetic is `fn`'s."""
    return torch.compile(fn, dynamic=True)  # type: ignore[return-value]


def dequantise(data: Tensor, scale: Tensor) -> Tensor:
    """float32 values of quantised rows (what the FP8 product multiplies, exactly)."""
    return data.float() * scale.unsqueeze(-1)


def quantise_weight(weight: Tensor) -> Fp8Matrix:
    data, scale = quantise_rows(weight)
    return Fp8Matrix(data, scale)


def scaled_mm(data: Tensor, scale: Tensor, w: Fp8Matrix, out_dtype: torch.dtype, emulate: bool) -> Tensor:
    """(data * scale) @ (w.data * w.scale).T for quantised rows data [M, K], scale [M]: [M, out] in out_dtype."""
    if emulate:
        return (dequantise(data, scale) @ dequantise(w.data, w.scale).t()).to(out_dtype)
    return torch._scaled_mm(data, w.data.t(), scale_a=scale.unsqueeze(1), scale_b=w.scale.unsqueeze(0),
                            out_dtype=out_dtype)


def fp8_linear(x: Tensor, w: Fp8Matrix, bias: Tensor | None, emulate: bool) -> Tensor:
    """`F.linear(x, weight, bias)` through FP8: x [..., in] quantised per row, then `scaled_mm`; x's dtype out."""
    data, scale = quantise_rows(x.reshape(-1, x.shape[-1]))
    out = scaled_mm(data, scale, w, x.dtype, emulate).view(*x.shape[:-1], -1)
    return out if bias is None else out + bias


def fp8_problem(device: torch.device, key: str = "rollout.precision=fp8",
                fix: str = "use rollout.precision=bf16") -> str | None:
    """Why `device` cannot run the FP8 products that setting `key` asks for (None when it can); `fix`: what to do."""
    if device.type != "cuda":
        return (f"{key} multiplies on FP8 tensor cores, which the device {device} does not have (it needs a CUDA GPU "
                f"of compute capability 8.9 or newer: L4/L40S, H100, H200, B200); {fix}")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < FP8_CAPABILITY:
        return (f"{key} needs FP8 tensor cores (compute capability 8.9 or newer); "
                f"{torch.cuda.get_device_name(device)} has {major}.{minor}; {fix}")
    if not hasattr(torch, "_scaled_mm"):
        return f"{key} needs torch._scaled_mm, which torch {torch.__version__} lacks; {fix}"
    return None


def check_shape(name: str, weight: Tensor, emulate: bool) -> None:
    """FP8 tensor cores multiply matrices whose both sides are multiples of 16; refuse others by name."""
    if not emulate and (weight.shape[0] % 16 or weight.shape[1] % 16):
        raise ValueError(f"rollout.precision=fp8 cannot multiply {name} {tuple(weight.shape)} on FP8 tensor cores "
                         "(both sides must be multiples of 16); use rollout.precision=bf16 for this policy")
