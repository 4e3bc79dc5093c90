"""The run's `model.*` keys as a policy, and the policy as the `model.*` keys the run logs.

The model layer knows nothing of the Hydra schema: it takes an `OFTSpec` (a fresh policy) or a checkpoint folder.
This module is the one translation between the two descriptions, above both:

- `spec_from_model_config`: the spec a fresh `ModelConfig` describes (the official OpenVLAConfig fields it implies
  ride along in `spec.raw`, so what is saved with the model is what the run used).
- `fresh_vla` / `vla_for_env`: the `PretrainedVLA` of a run; `vla_for_env` is what the trainers, `launch/eval.py`
  and the benchmarks call, and it refuses (`ConfigError`) every key that does not fit before anything starts:
  prompts that do not fit, images the env does not render, action or proprio sizes, a checkpoint the command line
  contradicts.
- `resolved_model_config`: the `ModelConfig` describing the policy a run actually holds (a checkpoint's values over
  the command line's), what `run_setup.resolved_config` logs.

Both dispatch on `model.family` through the family registry (`models/registry.py`): each family's record names its
own translation (OpenVLA-OFT's is this module's `oft_vla_for_env` / `oft_resolved_model_config`; the others live in
their folders, e.g. `models/pi0/run.py`). What they return is a `models/interface.PolicySource`.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from vla_scale.config import ConfigError, EnvConfig, ModelConfig
from vla_scale.envs.registry import simulator
from vla_scale.models.checkpoint_folders import step_folder
from vla_scale.models.kernels import kernels_problem
from vla_scale.models.oft.pretrained import CheckpointError, PretrainedVLA
from vla_scale.models.oft.spec import LLAMA_DEFAULTS, VISION_BACKBONES, OFTSpec, check_spec, llm_kwargs, timm_ids
from vla_scale.models.oft.vision import HALF_MEAN_STD, ViTSpec, timm_vit_spec
from vla_scale.models.registry import policy_family, run_family
from vla_scale.models.tokenizer import TextTokenizer, WordTokenizer

if TYPE_CHECKING:  # the policy module imports transformers' Llama: only what builds weights needs it
    from vla_scale.models.oft.policy import OFTPolicy

CHECKPOINT_OVERRIDES = ("checkpoint", "unnorm_key", "center_crop", "use_proprio", "num_images", "max_text_len",
                        "action_head", "action_log_std_init")
"""`model.*` keys applied on top of a checkpoint folder (the others describe a fresh policy, which a checkpoint
replaces with its own); `model.lora.*` is not a field of the policy either."""


# ---- ModelConfig -> OFTSpec -----------------------------------------------------------------------------------------
def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def tower_specs(cfg: ModelConfig) -> list[ViTSpec]:
    """The towers `cfg` asks for: timm architectures, or one small ViT of our own.

    Our own tower differs from the official featurizer on purpose (no class token, features after the last block
    and the final norm): it is trained from scratch and every block it has is used."""
    if cfg.timm_model_ids:
        return [timm_vit_spec(t, cfg.image_size) for t in cfg.timm_model_ids]
    return [ViTSpec(image_size=cfg.image_size, patch_size=cfg.patch_size, embed_dim=cfg.vision_dim,
                    depth=cfg.vision_layers, num_heads=cfg.num_heads, class_token=False, feature_block=-1,
                    norm_features=True, mean=HALF_MEAN_STD[0], std=HALF_MEAN_STD[1])]


def spec_from_model_config(cfg: ModelConfig, text_vocab_size: int, eos_id: int) -> OFTSpec:
    """The spec of a fresh policy described by `cfg` for a tokenizer of `text_vocab_size` ids ending prompts with
    `eos_id`; its `raw` holds the official OpenVLAConfig fields that `openvla_config` saves beside the rest.

    Vocabulary as OpenVLA lays it out: the action bins are the last `n_bins` ids of the text vocabulary (here
    appended after the tokenizer's ids, rounded up to `pad_to_multiple_of`), followed by one block of
    `pad_to_multiple_of` ids whose first is the pad token. `model.vocab_size` fixes the size instead (oft_7b: 32064).
    """
    m = cfg.pad_to_multiple_of
    vocab = cfg.vocab_size or _round_up(text_vocab_size + cfg.n_bins, m) + m
    if vocab - m - cfg.n_bins < text_vocab_size:
        raise ValueError(f"model.vocab_size={vocab} leaves no room for {text_vocab_size} text ids and "
                         f"{cfg.n_bins} action bins below the last {m} ids; raise it or set it to 0")
    text_config = {"vocab_size": vocab, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
                   "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
                   "num_key_value_heads": cfg.num_heads, "pad_token_id": vocab - m, "eos_token_id": eos_id}
    spec = OFTSpec(towers=tower_specs(cfg), llm=llm_kwargs(text_config, vocab - m), pad_to_multiple_of=m,
                   n_bins=cfg.n_bins, chunk_len=cfg.chunk_len, action_dim=cfg.action_dim,
                   proprio_dim=cfg.proprio_dim if cfg.use_proprio else 0, normalization="bounds_q99",
                   attention=cfg.attention, learned_action_queries=cfg.learned_action_queries,
                   ordinal_bin_init=cfg.ordinal_bin_init, center_crop=bool(cfg.center_crop),
                   unnorm_key=cfg.unnorm_key, num_images=cfg.num_images or 1, image_resize=cfg.image_resize,
                   action_head="l1" if cfg.action_head == "l1" else "tokens", log_std_init=cfg.action_log_std_init,
                   use_film=cfg.use_film, raw=_official_fields(cfg))
    check_spec(spec)
    return spec


def _official_fields(cfg: ModelConfig) -> dict[str, Any]:
    """The OpenVLAConfig fields of a fresh policy; with official towers and Llama-2 sizes, those of OpenVLA-7B."""
    fields: dict[str, Any] = {"model_type": "openvla", "architectures": ["OpenVLAForActionPrediction"],
                              "timm_model_ids": list(cfg.timm_model_ids), "image_resize_strategy": "resize-naive"}
    for backbone, (ids, size, acts) in VISION_BACKBONES.items():
        if ids == list(cfg.timm_model_ids) and size == cfg.image_size:
            fields.update(vision_backbone_id=backbone, timm_override_act_layers=acts,
                          arch_specifier="no-align+fused-gelu-mlp" if len(ids) == 2 else "no-align+gelu-mlp")
    if (cfg.hidden_size, cfg.num_layers) == (LLAMA_DEFAULTS["hidden_size"], LLAMA_DEFAULTS["num_hidden_layers"]):
        fields.update(llm_backbone_id="llama2-7b-pure", hf_llm_id="meta-llama/Llama-2-7b-hf", llm_max_length=2048)
    return fields


def build_policy(cfg: ModelConfig, tokenizer: TextTokenizer, zero3_init: bool = False) -> OFTPolicy:
    """A fresh policy `cfg` describes for this tokenizer (seed the RNG first for a reproducible init).
    `zero3_init`: the caller builds it inside `deepspeed.zero.Init`. A checkpoint's policy:
    `OFTPolicy.from_pretrained`; with its tokenizer and processor: `vla_for_env`."""
    if cfg.checkpoint:
        raise ValueError("build_policy builds a fresh policy; load model.checkpoint with OFTPolicy.from_pretrained")
    from vla_scale.models.oft.policy import OFTPolicy

    return OFTPolicy.from_spec(spec_from_model_config(cfg, tokenizer.vocab_size, tokenizer.eos_id),
                               zero3_init=zero3_init)


# ---- ModelConfig -> PretrainedVLA -----------------------------------------------------------------------------------
def fresh_vla(model: ModelConfig, instructions: list[str], env: str = "reach") -> PretrainedVLA:
    """A fresh policy `model` describes, with a word-level tokenizer of `instructions` (seed torch first for a
    reproducible init, which happens on first use of `.policy` or `new_policy`)."""
    if model.checkpoint:
        raise ValueError("fresh_vla builds a fresh policy; use PretrainedVLA.from_pretrained for model.checkpoint")
    tokenizer = WordTokenizer.from_instructions(instructions)
    spec = spec_from_model_config(model, tokenizer.vocab_size, tokenizer.eos_id)
    return PretrainedVLA.from_spec(spec, tokenizer, env, instructions, model.max_text_len,
                                   f"a fresh model={model.name}")


def _checkpoint_vla(model: ModelConfig, env: EnvConfig, instructions: list[str]) -> PretrainedVLA:
    from vla_scale.models.hub import HubError, resolve_checkpoint

    try:
        folder = resolve_checkpoint(model.checkpoint)  # a hub id becomes its cached snapshot
    except HubError as err:
        raise ConfigError(str(err)) from err
    try:
        folder = step_folder(folder)  # a training run: its latest step folder
        # the checkpoint decides its architecture (model.attention etc. describe fresh policies)
        return PretrainedVLA.from_pretrained(
            folder, model.unnorm_key or None, model.center_crop, use_proprio=model.use_proprio,
            num_images=model.num_images or None, env=env.name, suite=env.suite, max_text_len=model.max_text_len,
            instructions=instructions, action_head=model.action_head, log_std_init=model.action_log_std_init)
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        raise ConfigError(f"model.checkpoint={model.checkpoint!r}: {err}") from err


def vla_for_env(model: ModelConfig, env: EnvConfig, explicit: Collection[str] = ()) -> Any:
    """The policy of a run on `env` (a `models/interface.PolicySource` of `model.family`): `model.checkpoint`'s,
    else a fresh one; raises ConfigError naming every key that does not fit, before any simulator starts.
    `explicit`: the keys the command line set (`model.*` ones a checkpoint contradicts are refused rather than
    silently replaced by the checkpoint's values). `model.kernels` is refused first where it cannot run."""
    family = checkpoint_family_of(model, explicit)
    problem = kernels_problem(model.kernels)
    if problem:
        raise ConfigError(problem)
    source = policy_family(family).source_for_env()(replace(model, family=family), env, explicit)
    source.kernels = model.kernels
    return source


def checkpoint_family_of(model: ModelConfig, explicit: Collection[str] = ()) -> str:
    """The family `model.checkpoint`'s folder holds (`models/families.checkpoint_family`), else `model.family`; a
    `model.family` set on the command line that the folder contradicts is refused. Folders of no known family are
    left to the configured family's reader, whose refusal names what the folder lacks."""
    from vla_scale.models.families import CheckpointFolderError, checkpoint_family

    if not model.checkpoint:
        return model.family
    try:
        folder = step_folder(model.checkpoint)
        found = checkpoint_family(folder) if os.path.isdir(folder) else None
    except (CheckpointFolderError, FileNotFoundError):
        found = None
    if found is None:
        return model.family
    family = run_family(found.family)
    if family != model.family and "model.family" in explicit:
        raise ConfigError(f"model.family={model.family} but model.checkpoint={model.checkpoint!r} is a "
                          f"{found.note}: drop model.family (the folder decides it)")
    return family


def oft_vla_for_env(model: ModelConfig, env: EnvConfig, explicit: Collection[str] = ()) -> PretrainedVLA:
    """OpenVLA-OFT's `vla_for_env`."""
    instructions = simulator(env.name).instructions(env.suite)
    if model.checkpoint:
        vla = _checkpoint_vla(model, env, instructions)
    else:
        if "model.proprio_dim" not in explicit:  # a fresh policy reads the state the env gives
            model = replace(model, proprio_dim=simulator(env.name).state_size(env.simulator_kwargs()))
        try:
            vla = fresh_vla(model, instructions, env.name)
        except ValueError as err:
            raise ConfigError(f"model={model.name}: {err}") from err
    if model.lora.path:
        try:
            vla = vla.with_adapters(model.lora.path)
        except ValueError as err:
            raise ConfigError(f"model.lora.path={model.lora.path!r}: {err}") from err
    contradicted = contradicted_keys(vla, model, explicit) if model.checkpoint else []
    problems = contradicted + vla.check_env(env)
    if problems:
        what = "the command line and the checkpoint disagree, or the policy does not fit the env" if contradicted \
            else "the policy does not fit the env"
        raise ConfigError(what + ":\n  - " + "\n  - ".join(problems))
    return vla


# ---- PretrainedVLA -> ModelConfig -----------------------------------------------------------------------------------
def model_config_from_spec(spec: OFTSpec, base: ModelConfig | None = None) -> ModelConfig:
    """The ModelConfig that describes `spec` (fields that do not apply keep `base`'s values)."""
    base = base or ModelConfig()
    tower = spec.towers[0]
    timm = timm_ids(spec.raw)
    return replace(
        base, image_size=tower.image_size, patch_size=tower.patch_size,
        vision_dim=base.vision_dim if timm else tower.embed_dim,
        vision_layers=base.vision_layers if timm else tower.depth,
        hidden_size=spec.llm["hidden_size"], num_layers=spec.llm["num_hidden_layers"],
        num_heads=spec.llm["num_attention_heads"], intermediate_size=spec.llm["intermediate_size"],
        chunk_len=spec.chunk_len, action_dim=spec.action_dim, n_bins=spec.n_bins,
        use_proprio=spec.proprio_dim > 0 and spec.use_proprio, proprio_dim=spec.proprio_dim or base.proprio_dim,
        learned_action_queries=spec.learned_action_queries, ordinal_bin_init=spec.ordinal_bin_init,
        pad_to_multiple_of=spec.pad_to_multiple_of, attention=spec.attention, timm_model_ids=timm,
        vocab_size=spec.llm["vocab_size"], center_crop=spec.center_crop, unnorm_key=spec.unnorm_key,
        num_images=spec.num_images, image_resize=spec.image_resize, action_head=spec.action_head,
        action_log_std_init=spec.log_std_init, use_film=spec.use_film,
    )


def resolved_model_config(vla: Any, base: ModelConfig) -> ModelConfig:
    """The ModelConfig describing `vla`'s policy (the checkpoint's values over `base`; the prompt budget)."""
    return policy_family(vla.family).resolved_model_config()(vla, replace(base, family=vla.family))


def oft_resolved_model_config(vla: PretrainedVLA, base: ModelConfig) -> ModelConfig:
    """OpenVLA-OFT's `resolved_model_config`."""
    return replace(model_config_from_spec(vla.spec, base), max_text_len=vla.max_text_len,
                   use_proprio=vla.spec.use_proprio and vla.spec.proprio_dim > 0)


def contradicted_keys(vla: PretrainedVLA, model: ModelConfig, explicit: Collection[str]) -> list[str]:
    """One line per `model.*` key set in `explicit` whose value `vla`'s checkpoint policy does not have (keys in
    `CHECKPOINT_OVERRIDES` are applied on top of a checkpoint, so they never contradict it)."""
    resolved = oft_resolved_model_config(vla, model)
    problems = []
    for key in sorted(explicit):
        name = key.removeprefix("model.")
        if not key.startswith("model.") or name in CHECKPOINT_OVERRIDES or not hasattr(resolved, name):
            continue
        if getattr(resolved, name) != getattr(model, name):
            problems.append(f"model.{name}={getattr(model, name)!r} but {vla.source} has "
                            f"{getattr(resolved, name)!r}: the checkpoint decides its architecture; drop "
                            f"model.{name} (or load another checkpoint)")
    return problems


