"""A flow policy's prefix pass in FP8 for the rollout engine (`rollout.precision=fp8`): every linear layer of the
blocks the prefix runs (`FlowPolicy.prefix_blocks`: the vision tower's encoder layers and the VLM's decoder layers)
multiplies through an e4m3 copy of its weight, one scale per output channel (`models/fp8.py`), refreshed after each
weight sync.

The prefix is nearly all of a chunk decode's arithmetic (π0 at openpi's shapes: 97% of its FLOPs), computed once per
observation; the K denoising steps of the action expert, the embeddings, the projectors and the norms keep the
engine's dtype. Each layer's class is swapped in place for `Fp8PrefixLinear` while the copies exist and swapped back
by `release`, so the engine's policy and its weights stay the objects the sync writes, compares and fingerprints.
Its input is quantised per row as `models/fp8.fp8_linear` quantises it, by one compiled function on a GPU
(`models/fp8.fused`). At π0's shape on an H100 this pass is not faster than bf16's yet: the casts and launches around
each product cost what FP8 saves on it (docs/performance.md, "FP8 where the H100 pays, measured").

The rollout's log-probs are then those of a slightly different policy than the actor's bf16 one; the trainer treats
them as the behaviour policy's, as it does OFT's FP8 rollouts (`train/mismatch_*`, `algo.tis_cap`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vla_scale.models.fp8 import Fp8Matrix, check_shape, fused, quantise_rows, quantise_weight, scaled_mm


class Fp8PrefixLinear(nn.Linear):
    """A linear layer multiplying through its FP8 copy (`fp8`); `fp8_emulate`: in float32 on the dequantised values."""

    fp8: Fp8Matrix
    fp8_emulate: bool

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])
        data, scale = fused(quantise_rows)(rows) if x.is_cuda and not self.fp8_emulate else quantise_rows(rows)
        out = scaled_mm(data, scale, self.fp8, x.dtype, self.fp8_emulate).view(*x.shape[:-1], -1)
        return out if self.bias is None else out + self.bias


def prefix_linears(policy: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The linear layers of the policy's prefix blocks (`prefix_blocks`), named by their path in the policy."""
    paths = {id(m): path for path, m in policy.named_modules()}
    return [(paths[id(m)], m) for block in policy.prefix_blocks() for m in block.modules()
            if type(m) in (nn.Linear, Fp8PrefixLinear)]


class PrefixFp8:
    """The FP8 copies of a flow policy's prefix matrices (`ChunkDecoder.fp8_weights`): made by `refresh` after each
    sync, let go by `release` (module docstring). The policy's own forward multiplies with them: no fast forward."""

    needs_fast_forward = False

    def __init__(self, emulate: bool = False):
        self.emulate = emulate
        self.layers: list[nn.Linear] = []

    @torch.no_grad()
    def refresh(self, policy: nn.Module) -> None:
        """Quantise every prefix linear layer's weight as it is now (the previous copies let go first, so the new
        ones take their memory); a matrix FP8 tensor cores cannot take is refused by name."""
        self.release()
        linears = prefix_linears(policy)
        for path, m in linears:
            check_shape(path, m.weight, self.emulate)
        for _, m in linears:
            m.fp8, m.fp8_emulate = quantise_weight(m.weight), self.emulate
            m.__class__ = Fp8PrefixLinear
            self.layers.append(m)

    def release(self) -> None:
        """Every swapped layer back to `nn.Linear`, its FP8 copy let go."""
        for m in self.layers:
            m.__class__ = nn.Linear
            del m.fp8, m.fp8_emulate
        self.layers = []

    def nbytes(self) -> int:
        return sum(m.fp8.data.numel() + 4 * m.fp8.scale.numel() for m in self.layers if isinstance(m, Fp8PrefixLinear))
