"""π0 / π0.5 checkpoint folders in the two layouts users have them, read and written; what does not fit is refused
by name before any weight is built.

openpi layout (what openpi's JAX -> PyTorch conversion writes: openpi 15a9616a,
examples/convert_jax_model_to_pytorch.py):

    model.safetensors                 PI0Pytorch's state_dict, saved by `safetensors.torch.save_model`, which keeps one
                                      of PaliGemma's tied LM head / token embedding (`...lm_head.weight`)
    config.json                       {action_dim, action_horizon, paligemma_variant, action_expert_variant, precision}:
                                      no π0 / π0.5 flag (the weights tell) and no prompt budget (openpi's defaults:
                                      48 / 200). openpi's `pi05_libero` puts no state in the prompt, which this file
                                      cannot say either; our side file does
    assets/<asset_id>/norm_stats.json {"norm_stats": {"state": {mean, std, q01, q99}, "actions": {...}}}; the asset id
                                      may hold a slash (`physical-intelligence/libero`)

LeRobot layout (LeRobot 0.4+ `pi0` / `pi05` policies, `save_pretrained`):

    config.json                       {"type": "pi0" | "pi05", chunk_size, n_action_steps, max_state_dim,
                                      max_action_dim, num_inference_steps, tokenizer_max_length, paligemma_variant,
                                      action_expert_variant, normalization_mapping, input_features,
                                      output_features, empty_cameras, ...}
    model.safetensors                 the same weights, each name prefixed `model.`
    policy_preprocessor.json          the input pipeline's steps; its `normalizer_processor` step names its
    policy_preprocessor_step_<i>_normalizer_processor.safetensors   statistics: `observation.state.<stat>`,
                                      `action.<stat>` (mean, std, q01, q99, ...)
    policy_postprocessor.json         the output pipeline; `unnormalizer_processor`'s file holds `action.<stat>`
    policy_postprocessor_step_0_unnormalizer_processor.safetensors

Either layout may hold `tokenizer.model` (PaliGemma's SentencePiece model; openpi and LeRobot fetch theirs from
elsewhere, so usually it is absent), and, when we wrote it, `vla_scale.json`: the whole `Pi0Spec`, for the shapes
neither config.json can say (tiny towers, prompt budgets, state in the prompt). A folder's own config.json fields
must agree with it.

A Flow-Noise policy's noise head (`models/pi0/noise_head.py`) is written beside the weights, in
`noise_head.safetensors` under its parameter names, so that `model.safetensors` stays the layout's own: openpi and
LeRobot load the folder as it is, `read_pi0_folder` reads the policy without it, and `read_noise_head` gives it to a
Flow-Noise run that starts from the folder.

Statistics are returned as openpi names them (`state`, `actions`). LeRobot's own normaliser differs from openpi's in
its epsilon (1e-8 where openpi adds 1e-6 to the divisor, and none to q99 - q01 unless it is 0); the statistics are
the same either way, and a LeRobot folder's spec says `norm_convention="lerobot"` so that its policy normalises as
LeRobot does (models/flow/normalize.py; `model.pi0.norm_convention` chooses otherwise). We write LeRobot's
statistics as float64 (LeRobot reads any float) so that the round trip is exact.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import sentencepiece
import torch
from safetensors.torch import load_file, save_file

from vla_scale.models.families import (
    CONFIG,
    INDEX,
    LEROBOT_PREFIX,
    WEIGHTS,
    CheckpointFolderError,
    FamilyFound,
    checkpoint_family,
    read_json,
    weight_files,
    weight_shapes,
)
from vla_scale.models.flow.normalize import NormStats, read_norm_stats
from vla_scale.models.lerobot_folders import (
    DEVICE_STEP,
    LEROBOT_MODES,
    POSTPROCESSOR,
    PREPROCESSOR,
    normaliser_step,
    read_processor_stats,
    tokenizer_step,
    write_pipelines,
)
from vla_scale.models.pi0.noise_head import FILE as NOISE_HEAD_FILE
from vla_scale.models.pi0.noise_head import PREFIX as NOISE_HEAD_PREFIX
from vla_scale.models.pi0.noise_head import STD_BOUNDS, NoiseHead
from vla_scale.models.pi0.policy import Pi0Policy
from vla_scale.models.pi0.spec import GEMMA_VARIANTS, GemmaSpec, Pi0Spec, check_spec, spec_from_openpi

SIDE = "vla_scale.json"
ASSETS, NORM_STATS = "assets", "norm_stats.json"
TOKENIZERS = ("tokenizer.model", "paligemma_tokenizer.model")
"""A SentencePiece model beside the weights, under either name; we write the first."""
OPENPI_CAMERAS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
CUSTOM_VARIANT = "vla_scale_custom"
"""Written as a Gemma variant that neither openpi nor LeRobot has (tiny shapes); `vla_scale.json` holds the shapes."""
HEAD = "paligemma_with_expert.paligemma.lm_head.weight"
EMBED = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
"""PaliGemma's tied pair: safetensors keeps one of them, the reader gives both (one tensor)."""
LAYOUTS = ("openpi", "lerobot")


# ---- reading ------------------------------------------------------------------------------------------------------
def read_pi0_folder(folder: str | Path, asset_id: str | None = None, load: bool = True, check_shapes: bool = True
                    ) -> tuple[Pi0Spec, dict[str, torch.Tensor], dict[str, NormStats], Path | None, FamilyFound]:
    """(spec, state_dict in our parameter names, norm stats by openpi key, the tokenizer file or None, what was
    found) of a π0 / π0.5 folder of either layout. `asset_id`: which `assets/<id>` of an openpi folder to read (may
    be left out when there is one). Every check runs before a tensor is read: CheckpointFolderError otherwise.
    `load=False`: the checks and the rest without the tensors (an empty state_dict). `check_shapes=False` skips the
    weights' shapes against a policy built on the meta device, for a caller that checked them already and now builds
    the policy inside `deepspeed.zero.Init` (which would partition that meta build too)."""
    folder = Path(folder)
    found = checkpoint_family(folder)
    if found.family == "oft":
        raise CheckpointFolderError(f"{folder}: {found.note}, not a π0 / π0.5 one: load it as an OFT policy "
                                    "(model.checkpoint= picks the family)")
    if not (folder / CONFIG).exists():
        raise CheckpointFolderError(f"{folder} has no {CONFIG}: copy the one saved with the weights (openpi's "
                                    "conversion writes it beside model.safetensors)")
    config = read_json(folder / CONFIG)
    side = read_json(folder / SIDE) if (folder / SIDE).exists() else None
    if found.layout == "openpi":
        spec = _openpi_spec(folder, config, side, found.family == "pi05")
        stats, asset_id = _openpi_stats(folder, asset_id)
        steps = None
    else:
        spec, steps = _lerobot_spec(folder, config, side, found.family == "pi05")
        stats = read_processor_stats(folder)
    stats_problems(stats, spec, str(folder))
    tokenizer = _tokenizer_in(folder, spec)
    prefix = LEROBOT_PREFIX if found.layout == "lerobot" else ""
    if check_shapes:
        renamed = _check_shapes(folder, spec, prefix)
    else:
        renamed = _old_names({n.removeprefix(prefix): shape for n, shape in weight_shapes(folder).items()}, spec)
    state = _load(folder, prefix, renamed) if load else {}
    return spec, state, stats, tokenizer, replace(found, asset_id=asset_id, n_action_steps=steps)


def _refuse_bad_spec(folder: Path, build: Any) -> Pi0Spec:
    try:
        return build()
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointFolderError(f"{folder}/{CONFIG} does not describe a π0 policy vla_scale can build: {error}"
                                    ) from None


def _side_spec(folder: Path, side: dict[str, Any], pi05: bool, said: dict[str, tuple[str, Any]]) -> Pi0Spec:
    """The spec `vla_scale.json` holds, checked against what the layout's config.json says (`said`: spec field ->
    (config key, value))."""
    spec = _refuse_bad_spec(folder, lambda: Pi0Spec.from_dict(side["pi0_spec"]))
    _refuse_bad_spec(folder, lambda: check_spec(spec))
    said = {**said, "pi05": ("the weights' family", pi05)}
    differ = [f"{key}={value!r} but {SIDE} has {field}={getattr(spec, field)!r}"
              for field, (key, value) in said.items() if value is not None and value != getattr(spec, field)]
    if differ:
        raise CheckpointFolderError(f"{folder}: {CONFIG} and {SIDE} disagree: {'; '.join(differ)}. Restore the "
                                    f"edited file, or delete {SIDE} to read {CONFIG} alone")
    return spec


def _openpi_spec(folder: Path, config: dict[str, Any], side: dict[str, Any] | None, pi05: bool) -> Pi0Spec:
    if side is not None:
        said = {"action_dim": ("action_dim", config.get("action_dim")),
                "action_horizon": ("action_horizon", config.get("action_horizon"))}
        return _side_spec(folder, side, pi05, said)
    return _refuse_bad_spec(folder, lambda: spec_from_openpi(config, pi05=pi05))


def _lerobot_spec(folder: Path, config: dict[str, Any], side: dict[str, Any] | None, pi05: bool
                  ) -> tuple[Pi0Spec, int]:
    """The spec of a LeRobot config.json (openpi's names for its fields) and its `n_action_steps`."""
    mapping = config.get("normalization_mapping") or {"STATE": "QUANTILES" if pi05 else "MEAN_STD"}
    modes = {mapping.get("STATE"), mapping.get("ACTION", mapping.get("STATE"))}
    if len(modes) != 1 or not modes <= set(LEROBOT_MODES):
        raise CheckpointFolderError(
            f"{folder}/{CONFIG}: normalization_mapping STATE={mapping.get('STATE')!r}, "
            f"ACTION={mapping.get('ACTION')!r}; "
            f"vla_scale normalises state and actions alike, by {' or '.join(LEROBOT_MODES)}: retrain with one of them")
    features = config.get("input_features") or {}
    cameras = sum(1 for f in features.values() if isinstance(f, dict) and f.get("type") == "VISUAL")
    cameras += int(config.get("empty_cameras", 0) or 0)
    horizon = config.get("chunk_size", 50)
    steps = int(config.get("n_action_steps", horizon))
    openpi = {"paligemma_variant": config.get("paligemma_variant", "gemma_2b"),
              "action_expert_variant": config.get("action_expert_variant", "gemma_300m"),
              "action_dim": config.get("max_action_dim", 32), "action_horizon": horizon,
              "max_token_len": config.get("tokenizer_max_length"), "num_steps": config.get("num_inference_steps", 10)}
    normalization = LEROBOT_MODES[modes.pop()]
    if not pi05 and config.get("max_state_dim", openpi["action_dim"]) != openpi["action_dim"]:
        raise CheckpointFolderError(
            f"{folder}/{CONFIG}: max_state_dim={config['max_state_dim']} but max_action_dim={openpi['action_dim']}; "
            "π0 here pads the state to the action size: save the policy with the two equal")
    if side is not None:
        said = {"action_dim": ("max_action_dim", openpi["action_dim"]), "action_horizon": ("chunk_size", horizon),
                "max_token_len": ("tokenizer_max_length", openpi["max_token_len"]),
                "num_steps": ("num_inference_steps", openpi["num_steps"])}
        spec = _side_spec(folder, side, pi05, said)
        if spec.resolved_normalization != normalization:
            raise CheckpointFolderError(f"{folder}: {CONFIG}'s normalization_mapping says {normalization}, {SIDE} "
                                        f"{spec.resolved_normalization}: restore the edited file")
    else:
        spec = _refuse_bad_spec(folder, lambda: spec_from_openpi(
            openpi, pi05=pi05, normalization=normalization, num_images=cameras or len(OPENPI_CAMERAS)))
    if not 1 <= steps <= spec.action_horizon:
        raise CheckpointFolderError(f"{folder}/{CONFIG}: n_action_steps={steps} must be between 1 and chunk_size="
                                    f"{spec.action_horizon}")
    return replace(spec, norm_convention=spec.norm_convention or "lerobot"), steps


def _openpi_stats(folder: Path, asset_id: str | None) -> tuple[dict[str, NormStats], str]:
    """The norm stats of `assets/<asset_id>/`, the only asset id when none is given."""
    assets = folder / ASSETS
    ids = sorted(str(p.parent.relative_to(assets)) for p in assets.rglob(NORM_STATS)) if assets.is_dir() else []
    if asset_id is None:
        if not ids:
            raise CheckpointFolderError(
                f"{folder} has no normalisation statistics: looked for {assets}/<asset_id>/{NORM_STATS} (openpi keeps "
                "them there; its conversion copies them from the JAX checkpoint's assets/): copy that folder in")
        if len(ids) > 1:
            raise CheckpointFolderError(f"{folder} holds norm stats of several asset ids {ids}: choose one (asset_id, "
                                        "the robot or dataset the policy acts for)")
        asset_id = ids[0]
    path = assets / asset_id / NORM_STATS
    if asset_id not in ids:
        raise CheckpointFolderError(f"{folder}: no {path} (asset ids with norm stats: {ids or 'none'}): choose one of "
                                    "them, or copy the stats of this one in")
    try:
        return read_norm_stats(path), asset_id
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointFolderError(f"{path} is not openpi's norm_stats.json layout: {error}") from None


def stats_problems(stats: dict[str, NormStats], spec: Pi0Spec, source: str) -> None:
    """Statistics for `state` and `actions`, as wide as the robot's vectors (at most the model's action size), with
    quantiles where the spec normalises by them; else CheckpointFolderError naming the key."""
    problems = []
    for key in ("state", "actions"):
        if key not in stats:
            problems.append(f"no statistics for {key!r} (have {sorted(stats)})")
            continue
        s = stats[key]
        widths = {name: len(v) for name, v in (("mean", s.mean), ("std", s.std), ("q01", s.q01), ("q99", s.q99))
                  if v is not None}
        if len(set(widths.values())) > 1:
            problems.append(f"{key}: statistics of different widths {widths}")
        elif widths["mean"] > spec.action_dim:
            problems.append(f"{key}: {widths['mean']}-d statistics but the model's vectors are {spec.action_dim}-d")
        if spec.resolved_normalization == "quantile" and (s.q01 is None or s.q99 is None):
            problems.append(f"{key}: quantile normalisation needs q01 and q99")
    if problems:
        raise CheckpointFolderError(f"{source}: norm stats do not fit the policy: {'; '.join(problems)}")


def tokenizer_problem(path: Path, spec: Pi0Spec) -> str | None:
    """Why `path` cannot be the policy's tokenizer (not a SentencePiece model, or ids beyond the vocabulary)."""
    try:
        processor = sentencepiece.SentencePieceProcessor(model_proto=path.read_bytes())
    except (RuntimeError, OSError) as error:
        return (f"{path} is not a SentencePiece model ({str(error).splitlines()[0]}): use PaliGemma's "
                "paligemma_tokenizer.model, or leave the file out")
    if processor.vocab_size() > spec.vocab_size:
        return (f"{path} has {processor.vocab_size()} pieces but the model embeds {spec.vocab_size} tokens: use the "
                "tokenizer the policy was trained with")
    return None


def _tokenizer_in(folder: Path, spec: Pi0Spec) -> Path | None:
    for name in TOKENIZERS:
        if (folder / name).exists():
            problem = tokenizer_problem(folder / name, spec)
            if problem:
                raise CheckpointFolderError(problem)
            return folder / name
    return None


def expected_shapes(spec: Pi0Spec) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape for `spec`, from a policy built on the meta device (no memory, no init)."""
    with torch.device("meta"):
        policy = Pi0Policy(spec)
    return {name: tuple(t.shape) for name, t in policy.state_dict().items()}


def _check_shapes(folder: Path, spec: Pi0Spec, prefix: str) -> dict[str, str]:
    """The stored weights against the spec's, names and shapes; returns the old names to rename (LeRobot's)."""
    stored = {name.removeprefix(prefix): shape for name, shape in weight_shapes(folder).items()}
    renamed = _old_names(stored, spec)
    stored = {renamed.get(name, name): shape for name, shape in stored.items()}
    for one, other in ((HEAD, EMBED), (EMBED, HEAD)):
        if one in stored:
            stored.setdefault(other, stored[one])
    ours = expected_shapes(spec)
    missing, unexpected = sorted(set(ours) - set(stored)), sorted(set(stored) - set(ours))
    shapes = [f"{n} {stored[n]} (config: {ours[n]})" for n in ours if n in stored and stored[n] != ours[n]]
    problems = [f"{what}: {', '.join(names[:4])}{f' ... ({len(names)} in all)' if len(names) > 4 else ''}"
                for what, names in (("other shapes", shapes), ("missing", missing), ("unexpected", unexpected))
                if names]
    if problems:
        raise CheckpointFolderError(
            f"{folder}: the weights do not fit {CONFIG}{f' and {SIDE}' if (folder / SIDE).exists() else ''} "
            f"(π0.5={spec.pi05}, action_dim {spec.action_dim}, widths {spec.paligemma.width}/{spec.expert.width}, "
            f"depth {spec.paligemma.depth}): {'; '.join(problems)}. Use the config.json saved with these weights")
    return renamed


def _old_names(stored: dict[str, Any], spec: Pi0Spec) -> dict[str, str]:
    """Some π0 checkpoints on LeRobot's hub name π0's time MLP `time_mlp_*` (LeRobot renames them on load)."""
    if spec.pi05 or "action_time_mlp_in.weight" in stored or "time_mlp_in.weight" not in stored:
        return {}
    return {n: "action_" + n for n in stored if n.startswith(("time_mlp_in.", "time_mlp_out."))}


def read_noise_head(folder: str | Path, spec: Pi0Spec) -> dict[str, torch.Tensor]:
    """The folder's noise head tensors (`noise_head.safetensors`, under the policy's names), {} when it has none;
    CheckpointFolderError when they do not fit a head of `spec`."""
    path = Path(folder) / NOISE_HEAD_FILE
    if not path.is_file():
        return {}
    with torch.device("meta"):
        head = NoiseHead(spec.expert.width, spec.action_dim, *STD_BOUNDS)
    ours = {NOISE_HEAD_PREFIX + n: tuple(p.shape) for n, p in head.named_parameters()}
    try:
        tensors = load_file(str(path))
    except Exception as error:  # safetensors raises its own error types for a damaged file
        raise CheckpointFolderError(f"{path} is unreadable ({error}): remove it to start a fresh noise head"
                                    ) from None
    if {n: tuple(t.shape) for n, t in tensors.items()} != ours:
        raise CheckpointFolderError(f"{path} does not fit the noise head of this policy (expert width "
                                    f"{spec.expert.width}, action size {spec.action_dim}): remove it to start a fresh "
                                    "noise head")
    return tensors


def _load(folder: Path, prefix: str, renamed: dict[str, str]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in weight_files(folder):
        for name, tensor in load_file(str(file)).items():
            name = name.removeprefix(prefix)
            state[renamed.get(name, name)] = tensor
    state.setdefault(HEAD, state.get(EMBED))  # type: ignore[arg-type]
    state.setdefault(EMBED, state[HEAD])
    return state


# ---- writing ------------------------------------------------------------------------------------------------------
def write_pi0_folder(folder: str | Path, policy: Pi0Policy, norm_stats: dict[str, NormStats],
                     tokenizer_file: str | Path | None = None, layout: str = "openpi", asset_id: str = "libero"
                     ) -> Path:
    """Write `policy` as a checkpoint folder of `layout` ("openpi" or "lerobot") that `read_pi0_folder` reads back
    bit for bit: the weights as they are (one of the tied pair left out, as openpi's save does; a noise head's in
    `noise_head.safetensors`), config.json of the layout, `vla_scale.json` (the spec), the statistics (openpi:
    `assets/<asset_id>/norm_stats.json`; LeRobot: the processor files) and `tokenizer.model` when given. Files of
    an earlier save in `folder` (weights, statistics, processor files) are replaced. Everything is checked before a
    file is written."""
    folder, spec = Path(folder), policy.spec
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: choose one of {LAYOUTS}")
    if layout == "openpi" and (not asset_id or Path(asset_id).is_absolute() or ".." in Path(asset_id).parts):
        raise ValueError(f"asset_id={asset_id!r} must be a relative name such as 'libero' or 'physical-intelligence/"
                         "libero'")
    stats_problems(norm_stats, spec, "write_pi0_folder")
    if tokenizer_file is not None and (problem := tokenizer_problem(Path(tokenizer_file), spec)):
        raise CheckpointFolderError(problem)
    prefix = LEROBOT_PREFIX if layout == "lerobot" else ""
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in policy.state_dict().items() if n != EMBED}
    head = {n: t for n, t in tensors.items() if n.startswith(NOISE_HEAD_PREFIX)}
    state = {prefix + n: t for n, t in tensors.items() if n not in head}
    dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")

    folder.mkdir(parents=True, exist_ok=True)
    _remove_earlier_save(folder)
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
    if head:
        save_file(head, str(folder / NOISE_HEAD_FILE), metadata={"format": "pt"})
    (folder / SIDE).write_text(_json({"pi0_spec": spec.to_dict(), "layout": layout}))
    if layout == "openpi":
        (folder / CONFIG).write_text(_json(openpi_config(spec, dtype)))
        path = folder / ASSETS / asset_id / NORM_STATS
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_json({"norm_stats": {k: s.to_json() for k, s in norm_stats.items()}}))
    else:
        (folder / CONFIG).write_text(_json(lerobot_config(spec, norm_stats, dtype)))
        _write_lerobot_processors(folder, spec, norm_stats)
    if tokenizer_file is not None:
        shutil.copyfile(tokenizer_file, folder / TOKENIZERS[0])
    return folder


def _remove_earlier_save(folder: Path) -> None:
    for pattern in ("model*.safetensors", INDEX, f"{PREPROCESSOR}*", f"{POSTPROCESSOR}*", *TOKENIZERS, SIDE, CONFIG,
                    NOISE_HEAD_FILE):
        for path in folder.glob(pattern):
            path.unlink()
    if (folder / ASSETS).is_dir():
        shutil.rmtree(folder / ASSETS)


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


def variant_name(gemma: GemmaSpec) -> str:
    """openpi's name for these Gemma shapes, or CUSTOM_VARIANT."""
    return next((name for name, known in GEMMA_VARIANTS.items() if known == gemma), CUSTOM_VARIANT)


def openpi_config(spec: Pi0Spec, dtype: str) -> dict[str, Any]:
    """The five fields openpi's conversion writes."""
    return {"action_dim": spec.action_dim, "action_horizon": spec.action_horizon,
            "paligemma_variant": variant_name(spec.paligemma), "action_expert_variant": variant_name(spec.expert),
            "precision": dtype}


def _cameras(spec: Pi0Spec) -> list[str]:
    names = OPENPI_CAMERAS if spec.num_images == len(OPENPI_CAMERAS) else [f"camera_{i}" for i in
                                                                           range(spec.num_images)]
    return [f"observation.images.{name}" for name in names]


def _lerobot_features(spec: Pi0Spec, stats: dict[str, NormStats]) -> tuple[dict[str, Any], dict[str, Any]]:
    side = spec.vision.image_size
    inputs = {name: {"type": "VISUAL", "shape": [3, side, side]} for name in _cameras(spec)}
    inputs["observation.state"] = {"type": "STATE", "shape": [len(stats["state"].mean)]}
    return inputs, {"action": {"type": "ACTION", "shape": [len(stats["actions"].mean)]}}


def _lerobot_mode(spec: Pi0Spec) -> str:
    return {v: k for k, v in LEROBOT_MODES.items()}[spec.resolved_normalization]


def lerobot_config(spec: Pi0Spec, stats: dict[str, NormStats], dtype: str) -> dict[str, Any]:
    """LeRobot's PI0Config / PI05Config fields that describe the policy (training knobs keep LeRobot's defaults)."""
    inputs, outputs = _lerobot_features(spec, stats)
    mode = _lerobot_mode(spec)
    return {
        "type": "pi05" if spec.pi05 else "pi0", "n_obs_steps": 1, "input_features": inputs, "output_features": outputs,
        "device": None, "use_amp": False, "push_to_hub": False, "repo_id": None, "private": None, "tags": None,
        "license": None, "paligemma_variant": variant_name(spec.paligemma),
        "action_expert_variant": variant_name(spec.expert), "dtype": dtype, "chunk_size": spec.action_horizon,
        "n_action_steps": spec.action_horizon, "max_state_dim": spec.action_dim, "max_action_dim": spec.action_dim,
        "num_inference_steps": spec.num_steps, "time_sampling_beta_alpha": 1.5, "time_sampling_beta_beta": 1.0,
        "time_sampling_scale": 0.999, "time_sampling_offset": 0.001, "min_period": 4e-3, "max_period": 4.0,
        "image_resolution": [spec.vision.image_size, spec.vision.image_size], "empty_cameras": 0,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode},
        "tokenizer_max_length": spec.max_token_len,
    }


def _write_lerobot_processors(folder: Path, spec: Pi0Spec, stats: dict[str, NormStats]) -> None:
    """LeRobot's two pipelines of a pi0 / pi05 policy as its `save_pretrained` lays them out."""
    inputs, outputs = _lerobot_features(spec, stats)
    norm = normaliser_step({**inputs, **outputs}, spec.resolved_normalization)
    tokenizer = tokenizer_step(spec.max_token_len, "google/paligemma-3b-pt-224", "max_length")
    head = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
            {"registry_name": "to_batch_processor", "config": {}}]
    if spec.pi05:  # the state is normalised before it is written into the prompt
        steps = [*head, norm, {"registry_name": "pi05_prepare_state_tokenizer_processor_step",
                               "config": {"max_state_dim": spec.action_dim}}, tokenizer, DEVICE_STEP]
    else:
        steps = [*head, {"registry_name": "pi0_new_line_processor", "config": {}}, tokenizer, DEVICE_STEP, norm]
    write_pipelines(folder, steps, stats)


# ---- what an env can take -----------------------------------------------------------------------------------------
def action_horizon_problems(action_horizon: int, actions_per_chunk: int, max_steps: int | None = None,
                            robot_action_dim: int | None = None, env_action_dim: int | None = None,
                            model_action_dim: int | None = None) -> list[str]:
    """Every way a policy's chunk does not fit an env (empty when it fits), from the numbers alone:
    `action_horizon` actions predicted per chunk, `actions_per_chunk` of them played before the next decode
    (LeRobot's n_action_steps), the env's step limit (`max_steps`, the smallest of the suite's tasks'; None: none),
    the robot's action size (the statistics' width), the env's (its `Simulator.action_dim`) and the model's padded
    one."""
    problems = []
    if not 1 <= actions_per_chunk <= action_horizon:
        problems.append(f"{actions_per_chunk} actions played per chunk but the policy predicts {action_horizon}: "
                        f"play between 1 and {action_horizon} (n_action_steps)")
    if max_steps is not None and max_steps < min(actions_per_chunk, action_horizon):
        problems.append(f"the env's step limit {max_steps} is shorter than one chunk of {actions_per_chunk} actions: "
                        "every episode would end inside its first chunk; raise env.max_steps or play fewer actions "
                        "per chunk")
    if robot_action_dim is not None and env_action_dim is not None and robot_action_dim != env_action_dim:
        problems.append(f"the policy acts with {robot_action_dim}-d actions (its statistics), the env takes "
                        f"{env_action_dim}-d ones: use a checkpoint trained for this robot")
    if robot_action_dim is not None and model_action_dim is not None and robot_action_dim > model_action_dim:
        problems.append(f"{robot_action_dim}-d robot actions do not fit the model's {model_action_dim}-d output")
    return problems
