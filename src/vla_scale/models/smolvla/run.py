"""The run's `model.*` keys as a SmolVLA source, and back (the family's `run` module: `models/smolvla/family.py`).

`source_for_env` builds a fresh policy of the preset `model.smolvla.preset` names (its fields replaced by the
`model.smolvla.*` keys that are set) or reads `model.checkpoint`'s LeRobot folder, and refuses every key that does
not fit the env before anything starts; `resolved_model_config` gives the keys of the policy a run holds.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from vla_scale.config import ConfigError, EnvConfig, ModelConfig
from vla_scale.models.checkpoint_folders import step_folder
from vla_scale.models.flow.settings import apply_rl_settings, resolved_stochastic_steps
from vla_scale.models.smolvla.source import SmolVLASource
from vla_scale.models.smolvla.spec import PRESETS, SmolVLASpec, check_spec

SIZES = ("chunk_size", "max_state_dim", "max_action_dim", "num_steps", "tokenizer_max_length")
"""`model.smolvla.*` keys that are SmolVLASpec fields of the same name."""
SHAPE_KEYS = ("preset", "chunk_size", "max_state_dim", "max_action_dim", "tokenizer_max_length", "image_size")
"""`model.smolvla.*` keys a checkpoint decides (num_steps, n_action_steps and tokenizer may be set on top of one)."""


def spec_from_model_config(model: ModelConfig) -> SmolVLASpec:
    """The preset `model.smolvla.preset` names, its fields replaced by the `model.smolvla.*` keys that are set."""
    s = model.smolvla
    spec = replace(PRESETS[s.preset](), **{k: getattr(s, k) for k in SIZES if getattr(s, k)})
    if s.image_size:
        spec = replace(spec, resize_imgs_with_padding=(s.image_size, s.image_size))
    check_spec(spec)
    return spec


def source_for_env(model: ModelConfig, env: EnvConfig, explicit: Collection[str] = ()) -> SmolVLASource:
    """The SmolVLA policy of `model.checkpoint`'s folder, else a fresh one, on `env`; ConfigError naming each key
    that does not fit."""
    problems = ["model.lora.path is not supported for model.family=smolvla yet (merging an adapter folder)"] \
        if model.lora.path else []
    if model.checkpoint:
        problems += [f"model.smolvla.{key} is set but {model.checkpoint} decides it: drop it" for key in SHAPE_KEYS
                     if f"model.smolvla.{key}" in explicit]
    elif not model.smolvla.tokenizer:
        problems.append("model.smolvla.tokenizer is not set: name the folder of the VLM's tokenizer (SmolVLM2's "
                        "tokenizer.json and tokenizer_config.json; for the tiny shapes any small one, e.g. "
                        "tests/fixtures/smolvla_reference/vlm)")
    if problems:
        raise ConfigError("cannot build the policy:\n  - " + "\n  - ".join(problems))
    source = _checkpoint(model, env) if model.checkpoint else _fresh(model, env)
    apply_rl_settings(source, model.smolvla)
    env_problems = source.check_env(env)
    if env_problems:
        raise ConfigError("the policy does not fit the env:\n  - " + "\n  - ".join(env_problems))
    return source


def _fresh(model: ModelConfig, env: EnvConfig) -> SmolVLASource:
    try:
        return SmolVLASource.fresh(spec_from_model_config(model), model.smolvla.tokenizer, env.name,
                                   f"a fresh model={model.name}", model.smolvla.n_action_steps)
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.smolvla.tokenizer={model.smolvla.tokenizer!r} / model.smolvla.*: {err}") from err


def _checkpoint(model: ModelConfig, env: EnvConfig) -> SmolVLASource:
    try:
        source = SmolVLASource.from_folder(step_folder(model.checkpoint), env.name, model.smolvla.tokenizer)
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.checkpoint={model.checkpoint!r}: {err}") from err
    if model.smolvla.num_steps:  # how the folder's policy samples, not its shapes
        source.spec = replace(source.spec, num_steps=model.smolvla.num_steps)
    if model.smolvla.n_action_steps:
        source._actions_per_chunk = model.smolvla.n_action_steps
    return source


def resolved_model_config(source: SmolVLASource, base: ModelConfig) -> ModelConfig:
    """`base` with the spec's sizes under model.smolvla, the stochastic steps of RL's chain resolved to the method's,
    and `model.chunk_len` the actions of each chunk the env plays per decode."""
    spec, s = source.spec, base.smolvla
    smolvla = replace(s, **{k: getattr(spec, k) for k in SIZES}, image_size=spec.image_size,
                      n_action_steps=source.actions_per_chunk,
                      stochastic_steps=resolved_stochastic_steps(s.stochastic_steps, s.rl_noise))
    return replace(base, chunk_len=source.actions_per_chunk, smolvla=smolvla)
