"""The run's `model.*` keys as a π0 / π0.5 source, and back (the family's `run` module: `models/pi0/family.py`).

`source_for_env` builds a fresh policy of the preset `model.pi0.preset` names (its fields replaced by the
`model.pi0.*` keys that are set) or reads `model.checkpoint`'s folder in either layout, and refuses every key that
does not fit the env before anything starts; `resolved_model_config` gives the keys of the policy a run holds.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from vla_scale.config import ConfigError, EnvConfig, ModelConfig
from vla_scale.models.checkpoint_folders import step_folder
from vla_scale.models.flow.settings import apply_rl_settings, resolved_stochastic_steps
from vla_scale.models.pi0.source import Pi0Source
from vla_scale.models.pi0.spec import PRESETS, Pi0Spec, check_spec


def spec_from_model_config(model: ModelConfig) -> Pi0Spec:
    """The preset `model.pi0.preset` names, its fields replaced by the `model.pi0.*` keys that are set."""
    p = model.pi0
    overrides = {k: v for k, v in (("action_horizon", p.action_horizon), ("action_dim", p.action_dim),
                                   ("max_token_len", p.max_token_len), ("num_steps", p.num_steps),
                                   ("normalization", p.normalization), ("norm_convention", p.norm_convention))
                 if v}
    spec = replace(PRESETS[p.preset](), **overrides)
    vision = {k: v for k, v in (("image_size", p.image_size), ("patch_size", p.patch_size)) if v}
    spec = replace(spec, vision=replace(spec.vision, **vision)) if vision else spec
    check_spec(spec)
    return spec


def source_for_env(model: ModelConfig, env: EnvConfig, explicit: Collection[str] = ()) -> Pi0Source:
    """A fresh π0 / π0.5 policy on `env` (model.family=pi0), or ConfigError naming each key that does not fit."""
    unsupported = [f"model.{key} is not supported for model.family=pi0 yet ({why})" for key, value, why in (
        ("lora.path", model.lora.path, "merging an adapter folder into a π0 policy"),) if value]
    if model.checkpoint:
        return checkpoint_source(model, env, explicit, unsupported)
    if not model.pi0.tokenizer:
        unsupported.append("model.pi0.tokenizer is not set: name the PaliGemma SentencePiece model file "
                           "(paligemma_tokenizer.model; for the tiny shapes any SentencePiece model, e.g. "
                           "tests/fixtures/openpi_reference/tokenizer.model)")
    if unsupported:
        raise ConfigError("cannot build the policy:\n  - " + "\n  - ".join(unsupported))
    try:
        spec = spec_from_model_config(model)
        source = Pi0Source.fresh(spec, model.pi0.tokenizer, env.name, f"a fresh model={model.name}")
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.pi0.tokenizer={model.pi0.tokenizer!r} / model.pi0.*: {err}") from err
    apply_rl_settings(source, model.pi0)
    problems = source.check_env(env)
    if problems:
        raise ConfigError("the policy does not fit the env:\n  - " + "\n  - ".join(problems))
    return source


SHAPE_KEYS = ("preset", "action_horizon", "action_dim", "max_token_len", "normalization", "image_size", "patch_size")
"""`model.pi0.*` keys a checkpoint decides (num_steps, the sampling's, and tokenizer may be set on top of one)."""


def checkpoint_source(model: ModelConfig, env: EnvConfig, explicit: Collection[str],
                      problems: list[str]) -> Pi0Source:
    """The π0 / π0.5 policy of `model.checkpoint`'s folder (either layout) on `env`, or ConfigError naming every
    key that does not fit: `problems` found already, shape keys set on the command line (the folder decides them),
    what the folder lacks, what the env cannot take."""
    problems = problems + [f"model.pi0.{key} is set but {model.checkpoint} decides it: drop it" for key in
                           SHAPE_KEYS if f"model.pi0.{key}" in explicit]
    if problems:
        raise ConfigError("cannot build the policy:\n  - " + "\n  - ".join(problems))
    try:
        source = Pi0Source.from_folder(step_folder(model.checkpoint), env.name, model.pi0.tokenizer)
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.checkpoint={model.checkpoint!r}: {err}") from err
    for key in ("num_steps", "norm_convention"):  # how the folder's policy samples and normalises, not its shapes
        if getattr(model.pi0, key):
            source.spec = replace(source.spec, **{key: getattr(model.pi0, key)})
    apply_rl_settings(source, model.pi0)
    env_problems = source.check_env(env)
    if env_problems:
        raise ConfigError("the policy does not fit the env:\n  - " + "\n  - ".join(env_problems))
    return source


def resolved_model_config(source: Pi0Source, base: ModelConfig) -> ModelConfig:
    """`base` with the π0 spec's resolved sizes and normalisation under model.pi0, the stochastic steps of RL's
    chain resolved to the method's, and `model.chunk_len` the actions of each chunk the env plays per decode
    (`Pi0Source.actions_per_chunk`)."""
    spec = source.spec
    pi0 = replace(base.pi0, action_horizon=spec.action_horizon, action_dim=spec.action_dim,
                  max_token_len=spec.max_token_len, num_steps=spec.num_steps, normalization=spec.resolved_normalization,
                  stochastic_steps=resolved_stochastic_steps(base.pi0.stochastic_steps, base.pi0.rl_noise))
    return replace(base, chunk_len=source.actions_per_chunk, pi0=pi0)
