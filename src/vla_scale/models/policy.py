"""The OFT-shaped policy: vision encoder -> projector -> Llama backbone -> a whole action chunk in one pass.

Sequence fed to the Llama backbone (as input embeddings):

    [image patches (P)] [proprio token (0/1)] [instruction tokens (L, right-padded, BOS first)] [action slots (C*A)]

Action slots carry zero embeddings (as in OpenVLA-OFT) or, for small models trained from scratch, one learned
embedding per slot (`model.learned_action_queries`); the backbone's hidden states at
the C*A action slots go through the LM head, and the last `n_bins` rows of the vocabulary give the bin logits of
every action dimension of every step of the chunk at once. The vocabulary is [text tokens | n_bins action tokens]
padded to a multiple of `pad_to_multiple_of`; `action_token_begin` is where the bins start.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM

from vla_scale.config import ModelConfig
from vla_scale.envs.types import Observation
from vla_scale.models.tokenizer import PROMPT, ActionTokenizer, TextTokenizer


@dataclass
class PolicyInputs:
    """One batch of model inputs, as tensors."""

    pixel_values: Tensor  # float32[B, 3, S, S] in [-1, 1]
    input_ids: Tensor  # int64[B, L]
    attention_mask: Tensor  # bool[B, L]
    proprio: Tensor  # float32[B, d]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> PolicyInputs:
        return PolicyInputs(*(t.to(device, non_blocking=True) for t in vars(self).values()))


class Processor:
    """Observations (numpy, from the simulators) -> PolicyInputs."""

    def __init__(self, cfg: ModelConfig, tokenizer: TextTokenizer, camera: str = "agentview"):
        self.cfg, self.tokenizer, self.camera = cfg, tokenizer, camera

    def __call__(self, observations: list[Observation]) -> PolicyInputs:
        images = np.stack([o.images[self.camera] for o in observations])
        proprio = np.stack([o.proprio for o in observations]).astype(np.float32)
        return self.from_arrays(images, [o.instruction for o in observations], proprio)

    def from_arrays(self, images: np.ndarray, instructions: list[str], proprio: np.ndarray) -> PolicyInputs:
        pixels = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(127.5).sub_(1.0)
        if pixels.shape[-1] != self.cfg.image_size:
            pixels = F.interpolate(pixels, size=self.cfg.image_size, mode="bilinear", antialias=True)
        prompts = [PROMPT.format(instruction=text) for text in instructions]
        ids, mask = self.tokenizer.encode(prompts, self.cfg.max_text_len)
        return PolicyInputs(pixels, torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(proprio))


class VisionBlock(nn.Module):
    """Pre-norm transformer block with bidirectional SDPA attention."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(attn)
        return x + self.mlp(self.norm2(x))


class VisionEncoder(nn.Module):
    """A small ViT: patchify, learned positions, pre-norm transformer blocks."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        n_patches = (cfg.image_size // cfg.patch_size) ** 2
        self.patchify = nn.Conv2d(3, cfg.vision_dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.positions = nn.Parameter(torch.randn(1, n_patches, cfg.vision_dim) * 0.02)
        self.blocks = nn.ModuleList(VisionBlock(cfg.vision_dim, cfg.num_heads) for _ in range(cfg.vision_layers))
        self.norm = nn.LayerNorm(cfg.vision_dim)

    def forward(self, pixel_values: Tensor) -> Tensor:
        x = self.patchify(pixel_values).flatten(2).transpose(1, 2) + self.positions
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class ActionQueries(nn.Module):
    """Input embeddings of the action slots: learned per slot, or zeros as in OpenVLA-OFT.

    With zero embeddings a slot's identity (which step, which action dimension) reaches the backbone only through
    rotary positions; a small model trained from scratch learns much faster when each slot has its own embedding.
    """

    def __init__(self, slots: int, dim: int, learned: bool):
        super().__init__()
        self.slots, self.dim = slots, dim
        self.embedding = nn.Parameter(torch.randn(slots, dim) * 0.02) if learned else None

    def forward(self, like: Tensor) -> Tensor:
        batch = like.shape[0]
        if self.embedding is None:
            return like.new_zeros(batch, self.slots, self.dim)
        return self.embedding.to(like.dtype).unsqueeze(0).expand(batch, -1, -1)


def deepspeed_gather(param: nn.Parameter):
    """Gather a ZeRO-3 parameter for an in-place edit on rank 0 (broadcast to the others on exit)."""
    import deepspeed

    return deepspeed.zero.GatheredParameters([param], modifier_rank=0)


def _build_llama(config: LlamaConfig, zero3_init: bool) -> LlamaForCausalLM:
    """The Llama backbone; under `deepspeed.zero.Init` its parameters are empty shards once built, so
    transformers' weight init is deferred and run by the ZeRO-3 variant that gathers each module first."""
    if not zero3_init:
        return LlamaForCausalLM(config)
    from transformers import initialization
    from transformers.integrations.deepspeed import initialize_weights_zero3

    with initialization.no_init_weights():
        llm = LlamaForCausalLM(config)
    initialize_weights_zero3(llm)
    return llm


def _mlp(inp: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inp, out), nn.GELU(), nn.Linear(out, out))


class OFTPolicy(nn.Module):
    """Vision encoder + projector + Llama backbone with parallel decoding of a whole action chunk."""

    def __init__(self, cfg: ModelConfig, text_vocab_size: int, zero3_init: bool = False):
        super().__init__()
        self.cfg = cfg
        self.action_token_begin = text_vocab_size
        multiple = cfg.pad_to_multiple_of
        vocab = -(-(text_vocab_size + cfg.n_bins) // multiple) * multiple
        self.vision = VisionEncoder(cfg)
        self.projector = _mlp(cfg.vision_dim, cfg.hidden_size)
        self.proprio_projector = _mlp(cfg.proprio_dim, cfg.hidden_size) if cfg.use_proprio else None
        llama = LlamaConfig(
            vocab_size=vocab,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_heads,
            max_position_embeddings=1024,
            pad_token_id=0,
        )
        self.llm = _build_llama(llama, zero3_init)
        self.action_queries = ActionQueries(self.num_action_tokens, cfg.hidden_size, cfg.learned_action_queries)
        self.action_tokenizer = ActionTokenizer(cfg.n_bins)
        if cfg.ordinal_bin_init > 0:
            self._init_ordinal_bins(cfg.ordinal_bin_init, zero3_init)

    def _init_ordinal_bins(self, gain: float, zero3_init: bool) -> None:
        """Give the LM-head rows of the action bins a shared smooth component: row_j += gain * sum_k phi_k(c_j) v_k
        with bin centre c_j, phi = (c, c^2 - 1/3) and random unit directions v_k.

        Bins are unordered classes to the LM head; a policy trained from scratch by RL then has to raise each of
        256 rows on its own samples. With this component, moving the hidden state along v_1 tilts the whole
        distribution towards larger or smaller actions, and along v_2 widens or narrows it, so reward moves the
        distribution coherently from the first update. Pretrained checkpoints never need it (gain 0).
        """
        weight = self.llm.lm_head.weight
        centres = self.action_tokenizer.centres.astype(np.float64)
        basis = np.stack([centres, centres**2 - 1.0 / 3.0], axis=1)  # [n_bins, 2]
        directions = np.random.default_rng(0).standard_normal((2, self.cfg.hidden_size))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        smooth = torch.from_numpy((gain * basis @ directions).astype(np.float32))
        begin, end = self.action_token_begin, self.action_token_begin + self.cfg.n_bins
        context = deepspeed_gather(weight) if zero3_init else contextlib.nullcontext()
        with context, torch.no_grad():
            if weight.numel():
                weight[begin:end] += smooth.to(weight.dtype)

    @property
    def num_action_tokens(self) -> int:
        return self.cfg.chunk_len * self.cfg.action_dim

    def action_logits(
        self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor, proprio: Tensor | None = None
    ) -> Tensor:
        """Bin logits float[B, chunk*action_dim, n_bins] from one forward pass."""
        batch = input_ids.shape[0]
        parts = [self.projector(self.vision(pixel_values))]
        if self.proprio_projector is not None:
            assert proprio is not None, "this policy was built with use_proprio=True: pass proprio"
            parts.append(self.proprio_projector(proprio).unsqueeze(1))
        text = self.llm.get_input_embeddings()(input_ids)
        parts.append(text)
        parts.append(self.action_queries(text))
        embeds = torch.cat(parts, dim=1)
        prefix = embeds.shape[1] - text.shape[1] - self.num_action_tokens
        ones = attention_mask.new_ones(batch, prefix)
        mask = torch.cat([ones, attention_mask, attention_mask.new_ones(batch, self.num_action_tokens)], dim=1)
        hidden = self.llm.model(inputs_embeds=embeds, attention_mask=mask.long()).last_hidden_state
        logits = self.llm.lm_head(hidden[:, -self.num_action_tokens :])
        begin = self.action_token_begin
        return logits[..., begin : begin + self.cfg.n_bins].float()

    def forward(self, inputs: PolicyInputs) -> Tensor:
        return self.action_logits(inputs.pixel_values, inputs.input_ids, inputs.attention_mask, inputs.proprio)

    def tokens_to_actions(self, bin_ids: np.ndarray) -> np.ndarray:
        """Bin indices [B, chunk*action_dim] -> normalised actions float32[B, chunk, action_dim]."""
        actions = self.action_tokenizer.to_actions(bin_ids)
        return actions.reshape(-1, self.cfg.chunk_len, self.cfg.action_dim)


def build_policy(cfg: ModelConfig, tokenizer: TextTokenizer, zero3_init: bool = False) -> OFTPolicy:
    """A freshly initialised policy for this tokenizer (seed the RNG first for a reproducible init).

    `zero3_init`: the caller builds it inside `deepspeed.zero.Init`."""
    return OFTPolicy(cfg, tokenizer.vocab_size, zero3_init)
