"""SmolVLM and the action expert as modules: parameters laid out as LeRobot's `SmolVLMWithExpertModel` holds them.

The layers are run from outside, one at a time, by `models/smolvla/backbone.py` (the VLM's and the expert's side by
side), so what a decoder layer holds is all this module defines. The names are transformers' (which LeRobot's
state_dict keeps): `vlm.model.vision_model.*` (transformers' own `SmolVLMVisionTransformer`, run as it is),
`vlm.model.connector.modality_projection.proj.weight`, `vlm.model.text_model.{embed_tokens, layers.<i>, norm}`,
`vlm.lm_head.weight`, and the expert's `lm_expert.{layers.<i>, norm}` (no token embedding: LeRobot drops it). Only
the VLM's first `num_vlm_layers` layers exist, as LeRobot cuts the rest away.

The connector's pixel shuffle (`pixel_shuffle`) folds each scale x scale block of patches into one token whose
features are the block's patches in row-major order, each patch's features kept together; then one linear map (no
bias) to the text width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import SmolVLMVisionConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.smolvlm.modeling_smolvlm import SmolVLMVisionTransformer

from vla_scale.models.smolvla.spec import SmolVLASpec, VisionSpec


def vision_tower(spec: VisionSpec, zero3_init: bool = False) -> SmolVLMVisionTransformer:
    """transformers' SmolVLM vision transformer (SDPA attention). `zero3_init`: built inside
    `deepspeed.zero.Init`, where each layer is an empty shard once built, so transformers' init is deferred and run
    module by module with the parameters gathered (`init_gathered`)."""
    config = SmolVLMVisionConfig(
        hidden_size=spec.width, intermediate_size=spec.mlp_dim, num_hidden_layers=spec.depth,
        num_attention_heads=spec.num_heads, image_size=spec.image_size, patch_size=spec.patch_size,
        layer_norm_eps=spec.layer_norm_eps, hidden_act="gelu_pytorch_tanh", attn_implementation="sdpa",
    )
    if not zero3_init:
        return SmolVLMVisionTransformer(config)
    from transformers import initialization

    with initialization.no_init_weights():
        tower = SmolVLMVisionTransformer(config)
    init_gathered(tower, tower)
    return tower


def init_gathered(model: SmolVLMVisionTransformer, module: nn.Module) -> None:
    """transformers' init of every module under `module`, children first, each with its own and its direct
    children's parameters gathered (the init reaches into children), set on rank 0 and scattered back."""
    import deepspeed

    for child in module.children():
        init_gathered(model, child)
    params = [*module.parameters(recurse=False), *(p for c in module.children() for p in c.parameters(False))]
    with torch.no_grad(), deepspeed.zero.GatheredParameters(params, modifier_rank=0, enabled=bool(params)):
        if not deepspeed.comm.is_initialized() or deepspeed.comm.get_rank() == 0:
            model._init_weights(module)


def pixel_shuffle(patches: Tensor, scale: int) -> Tensor:
    """[B, side * side, D] -> [B, (side / scale)^2, D * scale^2]: each scale x scale block of the patch grid one
    token (module docstring)."""
    batch, count, width = patches.shape
    side = int(count**0.5)
    blocks = patches.reshape(batch, side // scale, scale, side // scale, scale, width)
    return blocks.permute(0, 1, 3, 2, 4, 5).reshape(batch, count // scale**2, width * scale**2)


class ModalityProjection(nn.Module):
    def __init__(self, inner: int, outer: int):
        super().__init__()
        self.proj = nn.Linear(inner, outer, bias=False)


class Connector(nn.Module):
    """SmolVLM's connector: the pixel shuffle, then `modality_projection.proj` to the text width."""

    def __init__(self, spec: SmolVLASpec):
        super().__init__()
        self.scale = spec.scale_factor
        self.modality_projection = ModalityProjection(spec.vision.width * spec.scale_factor**2, spec.text.width)

    def forward(self, patches: Tensor) -> Tensor:
        return self.modality_projection.proj(pixel_shuffle(patches, self.scale))


class Projections(nn.Module):
    """One attention block's projections (no bias); the attention itself runs in `backbone.py`. `kv_in`: the width
    the keys and values are projected from (the layer's own width, or a cross layer's VLM key width)."""

    def __init__(self, width: int, kv_in: int, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.q_proj = nn.Linear(width, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(kv_in, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(kv_in, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, width, bias=False)

    def heads(self, projected: Tensor) -> Tensor:
        """[B, L, heads * head_dim] -> [B, heads, L, head_dim]."""
        return projected.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)


class GatedMLP(nn.Module):
    """Llama's MLP: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, width: int, mlp_dim: int):
        super().__init__()
        self.gate_proj = nn.Linear(width, mlp_dim, bias=False)
        self.up_proj = nn.Linear(width, mlp_dim, bias=False)
        self.down_proj = nn.Linear(mlp_dim, width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One Llama layer: pre-norm attention and pre-norm SiLU-gated MLP (transformers' RMS norm)."""

    def __init__(self, spec: SmolVLASpec, width: int, mlp_dim: int, kv_in: int):
        super().__init__()
        text = spec.text
        self.self_attn = Projections(width, kv_in, text.num_heads, text.num_kv_heads, text.head_dim)
        self.mlp = GatedMLP(width, mlp_dim)
        self.input_layernorm = LlamaRMSNorm(width, eps=text.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(width, eps=text.rms_norm_eps)


class TextModel(nn.Module):
    """The VLM's decoder, cut to its first `num_vlm_layers` layers."""

    def __init__(self, spec: SmolVLASpec):
        super().__init__()
        width = spec.text.width
        self.embed_tokens = nn.Embedding(spec.text.vocab_size, width)
        self.layers = nn.ModuleList(DecoderLayer(spec, width, spec.text.mlp_dim, width)
                                    for _ in range(spec.num_vlm_layers))
        self.norm = LlamaRMSNorm(width, eps=spec.text.rms_norm_eps)


class Expert(nn.Module):
    """The action expert: `expert_depth` Llama layers of the expert's width; a cross layer's key and value
    projections read the VLM's keys and values (LeRobot shapes them by the expert layer's index)."""

    def __init__(self, spec: SmolVLASpec):
        super().__init__()
        width = spec.expert_width
        self.layers = nn.ModuleList(
            DecoderLayer(spec, width, spec.expert_mlp_dim, spec.kv_width if spec.cross_layer(j) else width)
            for j in range(spec.expert_depth))
        self.norm = LlamaRMSNorm(width, eps=spec.text.rms_norm_eps)


class SmolVLMModel(nn.Module):
    def __init__(self, spec: SmolVLASpec, zero3_init: bool = False):
        super().__init__()
        self.vision_model = vision_tower(spec.vision, zero3_init)
        self.connector = Connector(spec)
        self.text_model = TextModel(spec)


class SmolVLM(nn.Module):
    """`model` (tower, connector, decoder) and the LM head, which SmolVLA never runs (kept so that LeRobot's
    state_dict loads key for key; tied to the token embedding where the VLM's config says so)."""

    def __init__(self, spec: SmolVLASpec, zero3_init: bool = False):
        super().__init__()
        self.model = SmolVLMModel(spec, zero3_init)
        self.lm_head = nn.Linear(spec.text.width, spec.text.vocab_size, bias=False)
        if spec.text.tie_word_embeddings:
            self.lm_head.weight = self.model.text_model.embed_tokens.weight
        else:
            self.lm_head.requires_grad_(False)

    def embed_image(self, pixels: Tensor) -> Tensor:
        """Images [B, 3, S, S] in [-1, 1] -> [B, tokens, text width] (tower, then connector)."""
        tower = self.model.vision_model
        patches = tower(pixel_values=pixels.to(tower.embeddings.patch_embedding.weight.dtype)).last_hidden_state
        return self.model.connector(patches)
