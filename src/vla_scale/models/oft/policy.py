"""OFTPolicy: OpenVLA-OFT's parallel decoding of a whole action chunk in one forward pass, natively.

Sequence fed to the Llama backbone, per example (OFT's `predict_action` and training layout):

    [BOS] [patches of image 0, image 1, ...] ([proprio]) [prompt tokens 1..n-1] [K action slots] [stop] [pad ...]

The K = chunk_len * action_dim slots carry zero input embeddings (official) or one learned embedding each
(`learned_action_queries`, for small policies trained from scratch); the stop token is the tokenizer's EOS. Examples
of a batch are right-padded after their stop token, so each runs at the positions it would run at alone and padding
is only ever a masked key. Slot k is read one row earlier (next-token convention: the last prompt token predicts
slot 0, slot k-1 predicts slot k): the token head's logits there, restricted to the `n_bins` action tokens in
vocabulary order, or the L1-regression head over those rows' hidden states (`models/oft/action_heads.py`).

Attention: the official checkpoints run under the OFT transformers fork, whose SDPA path attends bidirectionally
over the whole sequence (pad keys masked); plain transformers attends causally. Both are a 4D additive mask here,
chosen by the spec (`bidirectional` default, `causal` for parity with plain transformers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

from vla_scale.models.critic import read_rows
from vla_scale.models.lora import ServesMerged
from vla_scale.models.oft.action_heads import ActionLogStd, L1RegressionHead, distribution, executable
from vla_scale.models.oft.actions import ActionTokenizer, DatasetStats
from vla_scale.models.oft.checkpoint_io import load_weights, read_proprio_dim, read_spec, save_policy
from vla_scale.models.oft.processor import ImageTransform, PolicyInputs, PreparedInputs, Processor
from vla_scale.models.oft.spec import OFTSpec
from vla_scale.models.oft.vision import Block, VisionBackbone

__all__ = ["OFTPolicy", "PolicyInputs", "Processor"]


class Projector(nn.Module):
    """Patch features -> Llama width (official `PrismaticProjector`: 3 GELU layers when fused, 2 otherwise)."""

    def __init__(self, vision_dim: int, llm_dim: int, fused: bool):
        super().__init__()
        self.fused = fused
        if fused:
            self.fc1, self.fc2 = nn.Linear(vision_dim, 4 * vision_dim), nn.Linear(4 * vision_dim, llm_dim)
            self.fc3 = nn.Linear(llm_dim, llm_dim)
            self.act_fn1, self.act_fn2 = nn.GELU(), nn.GELU()
        else:
            self.fc1, self.fc2, self.act_fn1 = nn.Linear(vision_dim, llm_dim), nn.Linear(llm_dim, llm_dim), nn.GELU()

    def forward(self, x: Tensor) -> Tensor:
        x = self.fc2(self.act_fn1(self.fc1(x)))
        return self.fc3(self.act_fn2(x)) if self.fused else x


class ProprioProjector(nn.Module):
    """Normalised proprio -> one Llama token (official `ProprioProjector`)."""

    def __init__(self, proprio_dim: int, llm_dim: int):
        super().__init__()
        self.fc1, self.act_fn1, self.fc2 = nn.Linear(proprio_dim, llm_dim), nn.GELU(), nn.Linear(llm_dim, llm_dim)

    def forward(self, proprio: Tensor) -> Tensor:
        return self.fc2(self.act_fn1(self.fc1(proprio)))


class ActionQueries(nn.Module):
    """Learned input embedding per action slot (a module, so ZeRO-3 gathers it when it runs)."""

    def __init__(self, slots: int, dim: int):
        super().__init__()
        self.embedding = nn.Parameter(torch.randn(slots, dim) * 0.02)

    def forward(self, index: Tensor) -> Tensor:
        return self.embedding[index]


def llama_config(llm: dict[str, Any]) -> LlamaConfig:
    """transformers' LlamaConfig from the spec's 4.40-style kwargs (rope_theta/rope_scaling -> rope_parameters)."""
    kwargs = dict(llm)
    theta, scaling = kwargs.pop("rope_theta"), kwargs.pop("rope_scaling")
    rope = {"rope_type": "default"} if scaling is None else {"rope_type": scaling.get("rope_type", scaling.get("type"))}
    rope.update({k: v for k, v in (scaling or {}).items() if k not in ("type", "rope_type")}, rope_theta=theta)
    return LlamaConfig(**kwargs, rope_parameters=rope)


class FusedRMSNorm(LlamaRMSNorm):
    """transformers' LlamaRMSNorm as one fused kernel (`F.rms_norm`, float32 inside) instead of seven element-wise
    passes, forward and backward: the norms' passes were a large share of a 7B training step (docs/performance.md).
    The product with the weight is rounded once instead of twice; the rollout engine's fast path computes the same."""

    def forward(self, hidden_states: Tensor) -> Tensor:
        if hidden_states.dtype != self.weight.dtype:
            return super().forward(hidden_states)
        return nn.functional.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight, self.variance_epsilon)


def _build_llama(config: LlamaConfig, zero3_init: bool, init: bool) -> LlamaForCausalLM:
    """The Llama backbone, its norms fused (`FusedRMSNorm`). Under `deepspeed.zero.Init` its parameters are empty
    shards once built, so transformers' weight init is deferred and run by the ZeRO-3 variant that gathers each module
    first; `init=False` skips the init altogether (weights are loaded next)."""
    from transformers import initialization

    if init and not zero3_init:
        return _fuse_norms(LlamaForCausalLM(config))
    with initialization.no_init_weights():
        llm = LlamaForCausalLM(config)
    if init:
        from transformers.integrations.deepspeed import initialize_weights_zero3

        initialize_weights_zero3(llm)
    return _fuse_norms(llm)


def _fuse_norms(llm: LlamaForCausalLM) -> LlamaForCausalLM:
    for module in llm.modules():
        if type(module) is LlamaRMSNorm:
            module.__class__ = FusedRMSNorm  # same parameters and attributes, another forward
    return llm


def deepspeed_gather(param: nn.Parameter):
    """Gather a ZeRO-3 parameter for an in-place edit on rank 0 (broadcast to the others on exit)."""
    import deepspeed

    return deepspeed.zero.GatheredParameters([param], modifier_rank=0)


class OFTPolicy(ServesMerged, nn.Module):
    """Vision backbone + projector + Llama backbone; one forward pass gives the bin logits of a whole chunk."""

    def __init__(self, spec: OFTSpec, zero3_init: bool = False, init: bool = True):
        super().__init__()
        self.spec = spec
        llm = llama_config(spec.llm)
        self.vision_backbone = VisionBackbone(spec.towers, llm.hidden_size if spec.use_film else 0)
        self.projector = Projector(self.vision_backbone.embed_dim, llm.hidden_size, len(spec.towers) == 2)
        self.language_model = _build_llama(llm, zero3_init, init)
        self.proprio_projector = ProprioProjector(spec.proprio_dim, llm.hidden_size) if spec.proprio_dim else None
        k = spec.num_action_tokens
        self.action_queries = ActionQueries(k, llm.hidden_size) if spec.learned_action_queries else None
        l1 = spec.action_head == "l1"
        self.action_head = L1RegressionHead(llm.hidden_size, spec.chunk_len, spec.action_dim) if l1 else None
        self.action_noise = ActionLogStd(spec.action_dim, spec.log_std_init) if l1 else None
        if l1:  # the L1 head reads the hidden states: the LM head never runs, so it has nothing to learn
            self.language_model.lm_head.requires_grad_(False)
        self.distribution = distribution(spec.action_head)
        """Samples, log-probs and entropies of what `forward` returns (`models/oft/action_heads.py`)."""
        self.action_tokenizer = ActionTokenizer(spec.n_bins)
        self.norm_stats = {key: DatasetStats.from_json(s, spec.normalization) for key, s in spec.norm_stats.items()}
        self.preprocessor: dict[str, Any] | None = None  # the checkpoint's preprocessor_config.json, when loaded
        if init and spec.ordinal_bin_init > 0:
            self._init_ordinal_bins(spec.ordinal_bin_init, zero3_init)

    # ---- construction -----------------------------------------------------------------------------------------------
    @classmethod
    def from_spec(cls, spec: OFTSpec, weights: str = "", zero3_init: bool = False, dtype: torch.dtype | None = None,
                  device: str | None = None) -> OFTPolicy:
        """The policy of `spec`: randomly initialised (seed torch first for a reproducible init) when `weights` is '',
        else built without init and the tensors of the checkpoint folder `weights` copied in (`spec` is that
        folder's, `checkpoint_io.read_spec`). In `dtype`, on `device` (None: torch's default ones); `zero3_init`:
        the caller builds it inside `deepspeed.zero.Init`."""
        from transformers import initialization

        place = contextlib.nullcontext() if zero3_init or device is None else torch.device(device)
        skip_init = initialization.no_init_weights() if weights else contextlib.nullcontext()
        with _default_dtype(dtype or torch.get_default_dtype()), place, skip_init:
            policy = cls(spec, zero3_init=zero3_init, init=not weights)
        if weights:
            load_weights(policy, weights, zero3_init)
        return policy

    @classmethod
    def unfilled(cls, spec: OFTSpec) -> OFTPolicy:
        """A policy of `spec` whose parameters are allocated but hold no values yet: no init, no checkpoint read, and
        on the host no memory in use either, as nothing writes the pages (`torch.empty`). The rollout engine's, which
        lays its weights out on its device (`RolloutEngine(filled=False)`) for the first weight sync to fill whole.
        Buffers (rotary tables) are computed as usual."""
        from transformers import initialization

        with initialization.no_init_weights():
            return cls(spec, init=False)

    @classmethod
    def from_pretrained(cls, path: str, zero3_init: bool = False, dtype: torch.dtype = torch.float32,
                        device: str | None = None, **overrides: Any) -> OFTPolicy:
        """Load an official OpenVLA-OFT folder (or one `save_pretrained` wrote); `overrides` replace spec fields
        (`checkpoint_io.read_spec`)."""
        spec = read_spec(path, proprio_dim=read_proprio_dim(path), **overrides)
        return cls.from_spec(spec, path, zero3_init, dtype, device)

    def save_pretrained(self, path: str, max_shard_gb: float = 5.0) -> None:
        """Write the official layout: config.json, model.safetensors (sharded past `max_shard_gb`), the proprio
        projector side file, dataset_statistics.json, preprocessor_config.json."""
        save_policy(self, path, max_shard_gb)

    def _init_ordinal_bins(self, gain: float, zero3_init: bool) -> None:
        """Give the LM-head rows of the action bins a shared smooth component: row_j += gain * sum_k phi_k(a_j) v_k
        with a_j the action bin j decodes to, phi = (a, a^2 - 1/3) and random unit directions v_k.

        Bins are unordered classes to the LM head; a policy trained from scratch by RL then has to raise each of
        256 rows on its own samples. With this component, moving the hidden state along v_1 tilts the whole
        distribution towards larger or smaller actions, and along v_2 widens or narrows it, so reward moves the
        distribution coherently from the first update. Pretrained checkpoints never need it (gain 0).
        """
        weight = self.language_model.lm_head.weight
        values = self.action_tokenizer.values
        basis = np.stack([values, values**2 - 1.0 / 3.0], axis=1)  # [n_bins, 2]
        directions = np.random.default_rng(0).standard_normal((2, self.spec.llm["hidden_size"]))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        smooth = torch.from_numpy((gain * basis @ directions).astype(np.float32))
        begin = self.spec.action_token_begin
        context = deepspeed_gather(weight) if zero3_init else contextlib.nullcontext()
        with context, torch.no_grad():
            if weight.numel():
                weight[begin : begin + self.spec.n_bins] += smooth.to(weight.device, weight.dtype)

    @property
    def num_action_tokens(self) -> int:
        return self.spec.num_action_tokens

    @property
    def action_token_begin(self) -> int:
        return self.spec.action_token_begin

    def image_transform(self) -> ImageTransform:
        """The image preprocessing this policy expects (the checkpoint's, else its towers')."""
        return ImageTransform.for_spec(self.spec, self.preprocessor)

    # ---- forward ----------------------------------------------------------------------------------------------------
    def prefix_embeddings(self, pixel_values: Tensor, proprio: Tensor | None,
                          vision: Callable[[Tensor, Tensor | None], Tensor], language: Tensor | None = None
                          ) -> Tensor:
        """Projected image patches, then the proprio token when there is one (`vision`: the towers to run, given
        the pixels and `language`, the FiLM conditioning of `film_language`)."""
        dtype = self.projector.fc1.weight.dtype
        prefix = self.projector(vision(pixel_values.to(dtype), language))
        if proprio is not None and self.proprio_projector is not None and self.spec.use_proprio:
            token = self.proprio_projector(proprio.reshape(prefix.shape[0], -1).to(dtype))
            prefix = torch.cat([prefix, token.unsqueeze(1)], dim=1)
        return prefix

    def film_language(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor | None:
        """What a FiLMed policy's towers are conditioned on (None without FiLM): per row, the mean input embedding
        of the language positions of its sequence, BOS, the prompt and the stop token after the action slots, as
        the official model averages them for one unpadded prompt (pads never count here, so a row's conditioning
        does not depend on the batch it is in)."""
        if not self.spec.use_film:
            return None
        ids = torch.cat([input_ids, torch.full_like(input_ids[:, :1], self.spec.stop_token_id)], dim=1)
        counted = nn.functional.pad(attention_mask, (0, 1), value=True)
        text = self.language_model.get_input_embeddings()(ids) * counted.unsqueeze(-1)
        return text.sum(dim=1) / counted.sum(dim=1, keepdim=True).to(text.dtype)

    def action_logits(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor,
                      proprio: Tensor | None = None, full_vocab: bool = False) -> Tensor:
        """Bin logits float32[B, chunk*action_dim, n_bins] from one forward pass (bins in vocabulary order).

        `input_ids` right-padded (BOS first, the prompt's last token in place); `proprio` already normalised, or
        None for no proprio token (also ignored when the policy has no proprio projector). `full_vocab=True` returns
        the logits over the whole vocabulary instead (what the official decode takes its argmax over).
        """
        return self.bin_logits(self.action_hidden_states(pixel_values, input_ids, attention_mask, proprio), full_vocab)

    def bin_logits(self, hidden: Tensor, full_vocab: bool = False) -> Tensor:
        """The token head's logits float32[B, K, n_bins] (or over the whole vocabulary) from the action rows' hidden
        states [B, K, D]."""
        logits = self.language_model.lm_head(hidden)
        if not full_vocab:
            logits = logits[..., self.spec.action_token_begin : self.spec.action_token_begin + self.spec.n_bins]
        return logits.float()

    def action_hidden_states(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor,
                             proprio: Tensor | None = None) -> Tensor:
        """The Llama backbone's last hidden states [B, chunk*action_dim, D] at the rows the action slots are read
        from (one row before each slot: the official `NUM_PATCHES + NUM_PROMPT_TOKENS` onwards), what the LM head
        and the L1-regression head both take."""
        dtype = self.projector.fc1.weight.dtype
        prefix = self.prefix_embeddings(pixel_values, proprio, self.vision_backbone,
                                        self.film_language(input_ids, attention_mask))
        embeds, valid, rows = self._sequence(prefix, input_ids, attention_mask)
        out = self.language_model.model(inputs_embeds=embeds, attention_mask=self._attention_bias(valid, dtype),
                                        use_cache=False)
        return out.last_hidden_state.gather(1, rows.unsqueeze(-1).expand(-1, -1, embeds.shape[-1]))

    def forward(self, inputs: PolicyInputs | PreparedInputs, device: torch.device | None = None,
                trim: bool = False) -> Tensor:
        """The action head's distribution parameters per action dimension: bin logits float32[B, K, n_bins]
        (tokens) or (mean, log-std) float32[B, K, 2] (l1), K = chunk*action_dim. `inputs` are brought to `device`
        first (host-side `PreparedInputs` normalised there). By default that is the first parameter's device; the
        ZeRO-3 actor names its own, since offloaded parameters live on the host. `trim` cuts the prompt columns to
        the batch's longest prompt (`PolicyInputs.trimmed`)."""
        return self.head_outputs(inputs, device, trim)[0]

    def head_outputs(self, inputs: PolicyInputs | PreparedInputs, device: torch.device | None = None,
                     trim: bool = False) -> tuple[Tensor, Tensor]:
        """`forward`'s distribution parameters and the action rows' hidden states [B, K, D] they came from (what a
        value head reads, `models/critic.py`)."""
        inputs = inputs.on(device or next(self.parameters()).device)
        if trim:
            inputs = inputs.trimmed()
        hidden = self.action_hidden_states(inputs.pixel_values, inputs.input_ids, inputs.attention_mask,
                                           inputs.proprio)
        return (self.bin_logits(hidden) if self.action_head is None else self.head_params(hidden)), hidden

    # ---- how the actor trains it ------------------------------------------------------------------------------------
    zero3_leaf_types = (LlamaDecoderLayer, Block)
    """Modules ZeRO-3 gathers whole, once per forward (`deepspeed.leaf_modules`)."""

    def activation_checkpointing_enable(self) -> None:
        """Every Llama layer and vision block keeps only its input in training and recomputes the rest in the
        backward pass (`deepspeed.activation_checkpointing`)."""
        lm = self.language_model  # transformers renamed it in 5.x; older images have only the first name
        enable = getattr(lm, "activation_checkpointing_enable", None) or lm.gradient_checkpointing_enable
        enable({"use_reentrant": False})
        self.vision_backbone.checkpointing_enable()

    def recompute_layers(self, count: int) -> None:
        """With checkpointing on: the first `count` Llama layers recompute, the rest keep their activations (-1:
        all)."""
        for index, layer in enumerate(self.language_model.model.layers):
            layer.gradient_checkpointing = count < 0 or index < count

    def value_features(self, inputs: PolicyInputs | PreparedInputs, device: torch.device | None = None,
                       trim: bool = False, *, position: str) -> tuple[Tensor, Tensor]:
        """`forward`'s distribution parameters and the hidden state [B, D] a value head reads at `position` from the
        action rows (`models/critic.py`), from one pass."""
        params, rows = self.head_outputs(inputs, device, trim)
        return params, read_rows(rows, position)

    @property
    def value_width(self) -> int:
        """The width of the hidden state a value head reads (the Llama backbone's)."""
        return int(self.spec.llm["hidden_size"])

    def head_params(self, hidden: Tensor) -> Tensor:
        """The L1 head's Gaussian [B, K, 2] (mean, log-std) from the action rows' hidden states [B, K, D]."""
        assert self.action_head is not None and self.action_noise is not None
        mean = self.action_head(hidden).float()
        log_std = self.action_noise(self.spec.chunk_len).float()
        return torch.stack([mean, log_std.expand_as(mean)], dim=-1)

    def _sequence(self, prefix: Tensor, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Input embeddings [B, T, D], key validity bool[B, T] and the logit rows int64[B, K] (module docstring)."""
        k, spec = self.num_action_tokens, self.spec
        lengths = attention_mask.long().sum(dim=1, keepdim=True)  # prompt tokens per row, BOS included
        cols = torch.arange(input_ids.shape[1] + k + 1, device=input_ids.device).unsqueeze(0)
        slots = (cols >= lengths) & (cols < lengths + k)
        ids = nn.functional.pad(input_ids, (0, k + 1), value=spec.pad_token_id)
        ids = torch.where(cols < lengths, ids, spec.pad_token_id)
        ids = torch.where(cols == lengths + k, spec.stop_token_id, ids)
        text = self.language_model.get_input_embeddings()(ids)
        if self.action_queries is None:
            text = text * ~slots.unsqueeze(-1)
        else:
            queries = self.action_queries((cols - lengths).clamp(0, k - 1).expand_as(ids))
            text = torch.where(slots.unsqueeze(-1), queries.to(text.dtype), text)
        embeds = torch.cat([text[:, :1], prefix.to(text.dtype), text[:, 1:]], dim=1)
        valid = torch.cat([torch.ones_like(slots[:, :1]).expand(-1, 1 + prefix.shape[1]),
                           (cols < lengths + k + 1)[:, 1:].expand(ids.shape[0], -1)], dim=1)
        rows = prefix.shape[1] + lengths - 1 + torch.arange(k, device=ids.device)
        return embeds, valid, rows

    def _attention_bias(self, valid: Tensor, dtype: torch.dtype) -> Tensor:
        """Additive mask [B, 1, T, T]: pad keys hidden; later positions too when causal."""
        t = valid.shape[1]
        allowed = valid[:, None, None, :].expand(-1, 1, t, -1)
        if self.spec.attention == "causal":
            allowed = allowed & torch.ones(t, t, dtype=torch.bool, device=valid.device).tril()
        bias = torch.zeros(allowed.shape, dtype=dtype, device=valid.device)
        return bias.masked_fill_(~allowed, torch.finfo(dtype).min)

    # ---- actions and proprio ---------------------------------------------------------------------------------------
    def dataset_stats(self, unnorm_key: str | None = None) -> DatasetStats | None:
        """Statistics of `unnorm_key` (default: the spec's, else the only dataset); None when there are none."""
        key = unnorm_key or self.spec.unnorm_key
        if not self.norm_stats:
            if key:
                raise KeyError(f"unnorm_key={key!r} but this policy has no dataset statistics")
            return None
        if not key:
            if len(self.norm_stats) > 1:
                raise KeyError(f"this policy has statistics of several datasets: pass unnorm_key, one of "
                               f"{sorted(self.norm_stats)}")
            key = next(iter(self.norm_stats))
        if key not in self.norm_stats:
            raise KeyError(f"unnorm_key={key!r} not in the policy's datasets {sorted(self.norm_stats)}")
        return self.norm_stats[key]

    def tokens_to_actions(self, samples: np.ndarray, unnorm_key: str | None = None, greedy: bool = True
                          ) -> np.ndarray:
        """One sample per action dimension [B, chunk*action_dim] (bin indices, or the l1 head's normalised values)
        -> actions float64[B, chunk, action_dim], un-normalised with the dataset statistics (normalised when the
        policy has none). The l1 head's values stay float32 until un-normalised, as the official code has them;
        sampled ones (`greedy=False`) are clipped to [-1, 1] first (`action_heads.executable`)."""
        shape = (-1, self.spec.chunk_len, self.spec.action_dim)
        if self.action_head is None:
            normalized = self.action_tokenizer.to_actions(samples).reshape(shape)
        else:
            normalized = executable(np.asarray(samples, dtype=np.float32).reshape(shape), greedy)
        stats = self.dataset_stats(unnorm_key)
        return normalized.astype(np.float64) if stats is None else stats.unnormalize_actions(normalized)

    def normalize_proprio(self, raw: np.ndarray, unnorm_key: str | None = None) -> np.ndarray:
        """Raw proprio [..., d] -> [-1, 1] with the dataset's bounds (official BOUNDS_Q99 / BOUNDS)."""
        stats = self.dataset_stats(unnorm_key)
        if stats is None:
            raise KeyError("this policy has no dataset statistics to normalise proprio with")
        return stats.normalize_proprio(np.asarray(raw, dtype=np.float64))


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
