"""OFT's weights in FP8 for the rollout engine's fast forward (`rollout.precision=fp8`): every matrix of the ViT blocks
and the Llama decoder layers quantised per output channel (`models/fp8.py`), refreshed after each weight sync."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from vla_scale.models.fp8 import Fp8Matrix, check_shape, quantise_weight


class Fp8Vit(NamedTuple):
    """One ViT block's matrices in FP8 (biases stay on the module, in bf16)."""

    qkv: Fp8Matrix
    proj: Fp8Matrix
    fc1: Fp8Matrix
    fc2: Fp8Matrix
    emulate: bool


class Fp8Llama(NamedTuple):
    """One decoder layer's matrices in FP8: q-k-v stacked (split at `q_out` and `q_out + k_out`), o, gate-up
    stacked (split at `gate_out`), down; the stacked biases where the layer has any."""

    qkv: Fp8Matrix
    qkv_bias: Tensor | None
    q_out: int
    k_out: int
    o: Fp8Matrix
    gate_up: Fp8Matrix
    gate_up_bias: Tensor | None
    gate_out: int
    down: Fp8Matrix
    emulate: bool


def _stacked_bias(*linears: torch.nn.Module) -> Tensor | None:
    biases = [m.bias for m in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else torch.zeros(m.weight.shape[0], dtype=m.weight.dtype,
                                                          device=m.weight.device)
                      for b, m in zip(biases, linears, strict=True)])


class Fp8Weights:
    """The FP8 copies of a policy's ViT and Llama matrices, refreshed from its bf16 weights after each sync."""

    needs_fast_forward = True
    """Only the fast forward (`models/oft/fast_forward.py`) multiplies with them."""

    def __init__(self, emulate: bool = False):
        self.emulate = emulate
        self.towers: dict[int, list[Fp8Vit]] = {}  # by id() of the ViT module
        self.layers: list[Fp8Llama] = []

    def _quantise(self, name: str, *linears: torch.nn.Module) -> Fp8Matrix:
        weight = torch.cat([m.weight for m in linears]) if len(linears) > 1 else linears[0].weight
        check_shape(name, weight, self.emulate)
        return quantise_weight(weight)

    @torch.no_grad()
    def refresh(self, policy: torch.nn.Module) -> None:
        """Quantise every block of the policy's towers and every decoder layer (the previous copies are let go
        first, so the new ones take their memory)."""
        self.release()
        backbone = policy.vision_backbone
        for vit in (backbone.featurizer, backbone.fused_featurizer):
            if vit is not None:
                self.towers[id(vit)] = [self._vit(f"tower block {i}", block)
                                        for i, block in enumerate(vit.blocks[: vit.spec.blocks_run])]
        llm = policy.language_model.model
        self.layers = [self._llama(f"decoder layer {i}", layer)
                       for i, layer in enumerate(llm.layers[: llm.config.num_hidden_layers])]

    def _vit(self, name: str, block: torch.nn.Module) -> Fp8Vit:
        return Fp8Vit(self._quantise(f"{name} qkv", block.attn.qkv), self._quantise(f"{name} proj", block.attn.proj),
                      self._quantise(f"{name} fc1", block.mlp.fc1), self._quantise(f"{name} fc2", block.mlp.fc2),
                      self.emulate)

    def _llama(self, name: str, layer: torch.nn.Module) -> Fp8Llama:
        attn, mlp = layer.self_attn, layer.mlp
        return Fp8Llama(self._quantise(f"{name} q-k-v", attn.q_proj, attn.k_proj, attn.v_proj),
                        _stacked_bias(attn.q_proj, attn.k_proj, attn.v_proj), attn.q_proj.weight.shape[0],
                        attn.k_proj.weight.shape[0], self._quantise(f"{name} o", attn.o_proj),
                        self._quantise(f"{name} gate-up", mlp.gate_proj, mlp.up_proj),
                        _stacked_bias(mlp.gate_proj, mlp.up_proj), mlp.gate_proj.weight.shape[0],
                        self._quantise(f"{name} down", mlp.down_proj), self.emulate)

    def release(self) -> None:
        self.towers, self.layers = {}, []

    def nbytes(self) -> int:
        matrices = [m for block in [*self.layers, *(b for t in self.towers.values() for b in t)]
                    for m in block if isinstance(m, Fp8Matrix)]
        return sum(m.data.numel() + 4 * m.scale.numel() for m in matrices)
