"""SmolVLAPolicy: SmolVLA's flow matching over an action chunk, as LeRobot's `VLAFlowMatching` computes it.

Sequence, per example (one mask decides who sees whom; `flow.policy.attention_allowed`):

    prefix: [image 0 tokens] [image 1] ... [prompt tokens, padded] [state]     images and prompt see each other (pads
                                                                              and missing cameras are masked keys);
                                                                              the state token sees them and itself
    suffix: [action 0] [action 1] ... [action H-1]                            each action sees the prefix, itself and
                                                                              the actions before it (causal)

Each camera's tokens are the tower's patches folded by the connector, times sqrt(VLM width); the prompt's token
embeddings are scaled by sqrt(VLM width) too, and the state (normalised, zero-padded to `max_state_dim`) is one
token through `state_proj`. Each action token is `action_in_proj` of the noisy action concatenated with the flow
time's sine-cosine embedding (periods `min_period` to `max_period`) and mixed by a 2-layer swish MLP
(`action_time_mlp_in`, `action_time_mlp_out`). How the two streams' layers interleave is `backbone.py`'s.

Flow matching, the Euler sampler and the RL chains are the shared `FlowPolicy`'s (`models/flow/policy.py`; LeRobot
keeps openpi's convention). Two things are LeRobot's own: the Euler times are 1 + k * dt rounded from float64
(`flow.policy.rounded_euler_times`), and `flow_loss` is per element over all `max_action_dim` dims, as LeRobot's
model returns it (its policy wrapper then cuts the robot's own action dims and averages; a caller does that here).
Parameter names are LeRobot's `VLAFlowMatching` state_dict's, so a LeRobot folder's `model.safetensors` loads with
its `model.` prefix stripped (`load_lerobot_state_dict`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vla_scale.models.flow.noise_head import NoiseHead
from vla_scale.models.flow.policy import (
    FlowInputs,
    FlowPolicy,
    PrefixCache,
    additive,
    attention_allowed,
    gathered,
    init_linear,
    rounded_euler_times,
    time_embedding,
)
from vla_scale.models.smolvla.backbone import SmolVLMWithExpert, Streams
from vla_scale.models.smolvla.spec import SmolVLASpec, check_spec


class SmolVLAPolicy(FlowPolicy):
    """SmolVLM + the action expert + the state, action and time projections of SmolVLA, and with `noise_std`
    (min, max) Flow-Noise's noise head, over the shared flow machinery (`FlowPolicy`)."""

    flow_times = staticmethod(rounded_euler_times)

    def __init__(self, spec: SmolVLASpec, zero3_init: bool = False, noise_std: tuple[float, float] | None = None):
        super().__init__()
        check_spec(spec)
        self.spec = spec
        width = spec.expert_width
        self.vlm_with_expert = SmolVLMWithExpert(spec, zero3_init)
        self.state_proj = nn.Linear(spec.max_state_dim, spec.text.width)
        self.action_in_proj = nn.Linear(spec.max_action_dim, width)
        self.action_out_proj = nn.Linear(width, spec.max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * width, width)
        self.action_time_mlp_out = nn.Linear(width, width)
        self.noise_head = None if noise_std is None else NoiseHead(width, spec.max_action_dim, *noise_std)
        """Flow-Noise's std network, or None (Flow-SDE, evaluation); built last, so the other parameters' init is
        the same with or without it."""

    # ---- construction -----------------------------------------------------------------------------------------------
    @classmethod
    def from_spec(cls, spec: SmolVLASpec, dtype: torch.dtype | None = None, device: str | None = None,
                  zero3_init: bool = False, noise_std: tuple[float, float] | None = None) -> SmolVLAPolicy:
        """A freshly initialised policy (seed torch first for a reproducible one): linear and embedding weights
        normal(0, 0.02), biases 0, RMS norms the identity, the tower's norms and patch convolution as transformers
        initialises them. `zero3_init`: the caller builds it inside `deepspeed.zero.Init`, where every parameter is
        an empty shard once built; each initialised module is then gathered while its init runs (the same draws, in
        the same order). `noise_std`: with Flow-Noise's noise head of these std bounds."""
        policy = cls(spec, zero3_init, noise_std)
        policy.apply(gathered(init_linear, (nn.Linear, nn.Embedding)) if zero3_init else init_linear)
        return policy if zero3_init else policy.to(dtype=dtype, device=device)

    def load_lerobot_state_dict(self, tensors: dict[str, Tensor], prefix: str = "model.") -> None:
        """Copy a LeRobot `SmolVLAPolicy` state_dict in (`model.safetensors`; `prefix` is what LeRobot's policy
        puts before `VLAFlowMatching`'s names). Exactly our keys are required, except that with tied embeddings one
        of the pair (LM head, token embedding) stands for both, as safetensors keeps only one, and that a noise
        head's tensors may be left out (it keeps its own); anything missing, unexpected or of another shape is
        refused by name."""
        tensors = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        tied = (LM_HEAD, EMBED) if self.spec.text.tie_word_embeddings else None
        self.load_checked_state_dict(tensors, "SmolVLA", tied)

    # ---- embeddings -------------------------------------------------------------------------------------------------
    @property
    def compute_dtype(self) -> torch.dtype:
        return self.action_in_proj.weight.dtype

    def embed_prefix(self, inputs: FlowInputs, skip_masked_slots: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """(embeddings [B, P, VLM width], pad bool[B, P], block starts bool[B, P]: only the state token starts one).
        Images go through the tower one camera slot at a time, as LeRobot runs them. `skip_masked_slots`: a camera
        slot masked in every row is left out (no key attends to it and its positions are not counted, so the prefix
        computes the same). Only where the module is not ZeRO-3's: every rank must run the tower equally often."""
        embs, pads = [], []
        for n in range(inputs.images.shape[1]):
            if skip_masked_slots and not bool(inputs.image_masks[:, n].any()):
                continue
            tokens = self._image_tokens(inputs.images[:, n])
            embs.append(tokens)
            pads.append(inputs.image_masks[:, n, None].expand(-1, tokens.shape[1]))
        language = self.vlm_with_expert.embed_tokens(inputs.tokens)
        embs.append(language * math.sqrt(language.shape[-1]))
        pads.append(inputs.token_masks.bool())
        embs.append(self.state_proj(inputs.state.to(self.compute_dtype))[:, None, :])
        pads.append(torch.ones_like(pads[-1][:, :1]))
        emb, pad = torch.cat(embs, dim=1), torch.cat(pads, dim=1)
        blocks = torch.zeros_like(pad)
        blocks[:, -1] = True
        missing = self.spec.prefix_length - pad.shape[1]
        if missing > 0:
            emb, pad, blocks = F.pad(emb, (0, 0, 0, missing)), F.pad(pad, (0, missing)), F.pad(blocks, (0, missing))
        return emb, pad, blocks

    def _image_tokens(self, pixels: Tensor) -> Tensor:
        """One camera slot [B, 3, S, S] -> its tokens [B, T, VLM width], scaled by sqrt(width) in the compute dtype
        (LeRobot rounds the factor to it), between the image's special tokens where the spec asks for them."""
        backbone = self.vlm_with_expert
        tokens = backbone.embed_image(pixels.to(self.compute_dtype))
        scale = torch.tensor(tokens.shape[-1] ** 0.5, dtype=tokens.dtype, device=tokens.device)
        tokens = tokens * scale
        if not self.spec.add_image_special_tokens:
            return tokens
        ids = torch.tensor([self.spec.fake_image_token_id, self.spec.global_image_token_id], device=tokens.device)
        special = backbone.embed_tokens(ids)[None].expand(tokens.shape[0], -1, -1)
        return torch.cat([special, tokens, special[:, :1]], dim=1)

    def embed_suffix(self, noisy_actions: Tensor, time: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(embeddings [B, H, expert width], pad [B, H], block starts [B, H]: every action starts one)."""
        actions = self.action_in_proj(noisy_actions.to(self.compute_dtype))
        periods = (self.spec.min_period, self.spec.max_period)
        emb_time = time_embedding(time, actions.shape[-1], periods).to(actions.dtype)
        mixed = torch.cat([actions, emb_time[:, None, :].expand_as(actions)], dim=2)
        tokens = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(mixed)))
        ones = torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device)
        return tokens, ones, ones

    # ---- the passes: joint (training), prefix (once per observation), suffix (each denoising step) -----------------
    def velocity_joint(self, inputs: FlowInputs, x_t: Tensor, time: Tensor) -> Tensor:
        """The predicted velocity float32[B, H, action_dim] at (x_t, time) from one pass over prefix and suffix."""
        prefix, prefix_pad, prefix_blocks = self.embed_prefix(inputs)
        suffix, suffix_pad, suffix_blocks = self.embed_suffix(x_t, time)
        pad = torch.cat([prefix_pad, suffix_pad], dim=1)
        allowed = attention_allowed(pad, torch.cat([prefix_blocks, suffix_blocks], dim=1).long())
        streams = Streams(prefix=prefix.to(self.compute_dtype), suffix=suffix.to(self.compute_dtype),
                          mask=additive(allowed), positions=torch.cumsum(pad, dim=1) - 1)
        _, out, _ = self.vlm_with_expert.run(streams)
        assert out is not None
        return self.velocity(out[:, -self.spec.chunk_size :])

    def prefix_pass(self, inputs: FlowInputs, skip_masked_slots: bool = False
                    ) -> tuple[PrefixCache, Tensor, Tensor]:
        """Every layer's rotated keys and values of the prefix, its pad mask, and its hidden states [B, P, VLM width]
        after the VLM's final norm (what a value head reads; the last valid row is the state token's)."""
        prefix, pad, blocks = self.embed_prefix(inputs, skip_masked_slots)
        streams = Streams(prefix=prefix.to(self.compute_dtype), suffix=None,
                          mask=additive(attention_allowed(pad, blocks.long())), positions=torch.cumsum(pad, dim=1) - 1)
        out, _, cache = self.vlm_with_expert.run(streams, keep_cache=True)
        assert out is not None
        return cache, pad, out

    def prefix_blocks(self) -> list[nn.Module]:
        """The SmolVLM tower's encoder layers and the VLM's decoder layers (the expert's run in the suffix passes)."""
        vlm = self.vlm_with_expert.vlm.model
        return [vlm.vision_model.encoder.layers, vlm.text_model.layers]

    def suffix_rows(self, state: Tensor, prefix_pad: Tensor, cache: PrefixCache, x_t: Tensor, time: Tensor) -> Tensor:
        """The expert's output rows at the actions [B, H, expert width] (after its final norm) at (x_t, time [B]),
        attending to the prefix's cache (`state` unused: SmolVLA's state is a prefix token)."""
        suffix, pad, blocks = self.embed_suffix(x_t, time)
        to_prefix = prefix_pad[:, None, :].expand(-1, suffix.shape[1], -1)
        allowed = torch.cat([to_prefix, attention_allowed(pad, blocks.long())], dim=2)
        positions = prefix_pad.sum(dim=1, keepdim=True) + torch.cumsum(pad, dim=1) - 1
        streams = Streams(prefix=None, suffix=suffix.to(self.compute_dtype), mask=additive(allowed),
                          positions=positions)
        _, out, _ = self.vlm_with_expert.run(streams, cache=cache)
        assert out is not None
        return out[:, -self.spec.chunk_size :]

    # ---- how the actor trains it ------------------------------------------------------------------------------------
    zero3_leaf_types: tuple[type[nn.Module], ...] = ()
    """None here: the layer loop calls into both decoders' submodules, so ZeRO-3 gathers per submodule."""

    def activation_checkpointing_enable(self) -> None:
        """Every layer of the two decoders and of the tower keeps only its input in training and recomputes the rest
        in the backward pass."""
        self.vlm_with_expert.vlm.model.vision_model.activation_checkpointing_enable({"use_reentrant": False})
        self.recompute_layers(-1)

    def recompute_layers(self, count: int) -> None:
        """The first `count` layers recompute in the backward pass, the rest keep their activations (-1: all)."""
        self.vlm_with_expert.recompute = count

    @property
    def value_width(self) -> int:
        """The width of the hidden state a value head reads (the VLM's decoder)."""
        return self.spec.text.width


LM_HEAD = "vlm_with_expert.vlm.lm_head.weight"
EMBED = "vlm_with_expert.vlm.model.text_model.embed_tokens.weight"
