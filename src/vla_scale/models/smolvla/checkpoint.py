"""SmolVLA checkpoint folders in LeRobot's layout, read and written, so a LeRobot user moves a policy both ways; what
does not fit is refused by name before any weight is built.

    config.json                       LeRobot's SmolVLAConfig: {"type": "smolvla", input_features, output_features,
                                      chunk_size, n_action_steps, max_state_dim, max_action_dim,
                                      resize_imgs_with_padding, tokenizer_max_length, num_steps, vlm_model_name,
                                      num_vlm_layers, num_expert_layers, self_attn_every_n_layers,
                                      expert_width_multiplier, attention_mode, ...}
    model.safetensors                 `VLAFlowMatching`'s state_dict, each name prefixed `model.`
    policy_preprocessor.json (+ its normaliser's .safetensors), policy_postprocessor.json (+ the unnormaliser's):
                                      the pipelines and the dataset statistics (`models/lerobot_folders.py`)
    tokenizer/                        the VLM's tokenizer files, as LeRobot's pre-processor saves them
    vlm/                              (ours) the VLM's config.json, processor_config.json and tokenizer: what
                                      LeRobot's `vlm_model_name` reads when it is not SmolVLM2-500M

The VLM's shapes are not in config.json: LeRobot reads them from `vlm_model_name`'s config. SmolVLM2-500M-Video-
Instruct's (the default) are known here; for another VLM the folder must say them, in `vlm/config.json` (what we
write, and `vlm_model_name` then names that folder) or a local `vlm_model_name` folder. When we wrote the folder,
`vla_scale.json` holds the whole `SmolVLASpec`. A Flow-Noise policy's noise head is written beside the weights
(`noise_head.safetensors`), so `model.safetensors` stays LeRobot's own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from vla_scale.models.families import (
    CONFIG,
    WEIGHTS,
    CheckpointFolderError,
    FamilyFound,
    checkpoint_family,
    read_json,
    weight_shapes,
)
from vla_scale.models.flow.normalize import NormStats
from vla_scale.models.lerobot_folders import (
    DEVICE_STEP,
    POSTPROCESSOR,
    PREPROCESSOR,
    normaliser_step,
    read_processor_stats,
    tokenizer_step,
    write_pipelines,
)
from vla_scale.models.smolvla.spec import SMOLVLM2_500M, SmolVLASpec, check_spec, spec_from_lerobot
from vla_scale.models.smolvla.tokenizer import FILES as TOKENIZER_FILES

SIDE = "vla_scale.json"
VLM, TOKENIZER, PROCESSOR = "vlm", "tokenizer", "processor_config.json"
PREFIX = "model."
STATE, ACTION, CAMERA = "observation.state", "action", "observation.images."


def read_smolvla_folder(folder: str | Path) -> tuple[SmolVLASpec, dict[str, NormStats], Path | None, FamilyFound]:
    """(spec, statistics, the folder's tokenizer folder or None, what `checkpoint_family` found) of a LeRobot
    SmolVLA folder; every weight's name and shape checked against the spec (from the safetensors header, no
    tensor read)."""
    folder = Path(folder)
    found = checkpoint_family(folder)
    if found.family != "smolvla":
        raise CheckpointFolderError(f"{folder} is a {found.note}, not a SmolVLA policy: set model.family to match")
    config = read_json(folder / CONFIG)
    spec = _spec(folder, config)
    _check_shapes(folder, spec)
    stats = read_processor_stats(folder)
    tokenizer = folder / TOKENIZER
    own = tokenizer if all((tokenizer / f).is_file() for f in TOKENIZER_FILES) else None
    steps = config.get("n_action_steps")
    return spec, stats, own, FamilyFound(found.family, found.layout, found.note,
                                         n_action_steps=int(steps) if steps else None)


def _spec(folder: Path, config: dict[str, Any]) -> SmolVLASpec:
    if (folder / SIDE).is_file():
        try:
            spec = SmolVLASpec.from_dict(read_json(folder / SIDE)["spec"])
            check_spec(spec)
            return spec
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointFolderError(f"{folder / SIDE} does not describe a SmolVLA spec ({error}): delete it to "
                                        "read the folder from config.json alone") from None
    try:
        return spec_from_lerobot(config, _vlm_config(folder, config))
    except (TypeError, ValueError) as error:
        raise CheckpointFolderError(f"{folder / CONFIG}: {error}") from None


def _vlm_config(folder: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The VLM's config.json: the folder's `vlm/`, a local `vlm_model_name` folder, or None for SmolVLM2-500M."""
    name = str(config.get("vlm_model_name", SMOLVLM2_500M))
    for place in (folder / VLM, folder / name, Path(name)):
        if (place / CONFIG).is_file():
            return read_json(place / CONFIG)
    if name == SMOLVLM2_500M:
        return None
    raise CheckpointFolderError(
        f"{folder / CONFIG} builds on vlm_model_name={name!r}, whose shapes are not known here and whose config.json "
        f"is not in {folder / VLM}: copy that VLM's config.json to {folder / VLM / CONFIG}")


def _check_shapes(folder: Path, spec: SmolVLASpec) -> None:
    """The weights' names and shapes against the policy the spec builds (on the meta device: no memory)."""
    import torch

    from vla_scale.models.smolvla.policy import SmolVLAPolicy

    with torch.device("meta"):
        expected = {n: tuple(p.shape) for n, p in SmolVLAPolicy(spec).state_dict().items()}
    stored = {n.removeprefix(PREFIX): s for n, s in weight_shapes(folder).items()}
    optional = {n for n in expected if n.endswith("lm_head.weight")}
    problems = [f"missing {n}" for n in sorted(set(expected) - set(stored) - optional)]
    problems += [f"unexpected {n}" for n in sorted(set(stored) - set(expected))]
    problems += [f"{n}: stored {stored[n]}, the config gives {expected[n]}" for n in sorted(set(stored) & set(expected))
                 if tuple(stored[n]) != expected[n]]
    if problems:
        raise CheckpointFolderError(f"{folder / WEIGHTS} does not fit its config.json ({len(problems)} problems: "
                                    f"{'; '.join(problems[:4])}): the folder mixes two checkpoints, or the VLM's "
                                    "config is not the one the policy was trained on")


def load_weights(folder: str | Path) -> dict[str, Any]:
    """Every tensor of `model.safetensors`, named as the policy names them (LeRobot's `model.` cut)."""
    from safetensors.torch import load_file

    return {n.removeprefix(PREFIX): t for n, t in load_file(str(Path(folder) / WEIGHTS)).items()}


# ---- writing --------------------------------------------------------------------------------------------------------
def write_smolvla_folder(folder: str | Path, tensors: dict[str, Any], spec: SmolVLASpec, stats: dict[str, NormStats],
                         tokenizer: Path, cameras: list[str], n_action_steps: int) -> None:
    """The policy's `tensors` (its state_dict's names; a noise head's go to `noise_head.safetensors`) as a LeRobot
    SmolVLA folder with the statistics, the tokenizer and the VLM's config; `cameras` name the image features."""
    from safetensors.torch import save_file

    from vla_scale.models.flow.noise_head import FILE as NOISE_HEAD_FILE
    from vla_scale.models.flow.noise_head import PREFIX as NOISE_HEAD

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in (WEIGHTS, NOISE_HEAD_FILE, SIDE):
        (folder / stale).unlink(missing_ok=True)
    model = {PREFIX + n: t.contiguous() for n, t in tensors.items() if not n.startswith(NOISE_HEAD)}
    save_file(model, str(folder / WEIGHTS), metadata={"format": "pt"})
    head = {n: t.contiguous() for n, t in tensors.items() if n.startswith(NOISE_HEAD)}
    if head:
        save_file(head, str(folder / NOISE_HEAD_FILE))
    config = lerobot_config(spec, stats, cameras, n_action_steps)
    _write(folder / CONFIG, config)
    _write(folder / SIDE, {"spec": spec.to_dict()})
    for place in (TOKENIZER, VLM):  # the pre-processor's tokenizer, and the VLM folder LeRobot's model reads
        if (folder / place).resolve() != tokenizer.resolve():
            shutil.rmtree(folder / place, ignore_errors=True)
            (folder / place).mkdir()
            for name in TOKENIZER_FILES:
                shutil.copyfile(tokenizer / name, folder / place / name)
    _write(folder / VLM / CONFIG, vlm_config(spec))
    _write(folder / VLM / PROCESSOR, processor_config(spec))
    features = {**config["input_features"], **config["output_features"]}
    for stale in folder.glob(f"{PREPROCESSOR}*"):
        stale.unlink()
    for stale in folder.glob(f"{POSTPROCESSOR}*"):
        stale.unlink()
    steps = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
             {"registry_name": "to_batch_processor", "config": {}},
             {"registry_name": "smolvla_new_line_processor", "config": {}},
             tokenizer_step(spec.tokenizer_max_length, TOKENIZER, "longest") | {"artifacts": {
                 "tokenizer_name": TOKENIZER}},
             DEVICE_STEP, normaliser_step(features, "zscore")]
    write_pipelines(folder, steps, stats)


def lerobot_config(spec: SmolVLASpec, stats: dict[str, NormStats], cameras: list[str], n_action_steps: int
                   ) -> dict[str, Any]:
    """LeRobot's SmolVLAConfig fields that describe the policy (training knobs keep LeRobot's defaults)."""
    side = spec.image_size
    inputs: dict[str, Any] = {STATE: {"type": "STATE", "shape": [len(stats["state"].mean)]}}
    inputs |= {CAMERA + c: {"type": "VISUAL", "shape": [3, side, side]} for c in cameras[: spec.num_images]}
    default_vlm = (spec.vision, spec.text, spec.scale_factor) == (type(spec.vision)(), type(spec.text)(), 4)
    resize = list(spec.resize_imgs_with_padding) if spec.resize_imgs_with_padding else None
    return {
        "type": "smolvla", "n_obs_steps": 1, "input_features": inputs,
        "output_features": {ACTION: {"type": "ACTION", "shape": [len(stats["actions"].mean)]}},
        "device": "cpu", "use_amp": False, "chunk_size": spec.chunk_size, "n_action_steps": n_action_steps,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
        "max_state_dim": spec.max_state_dim, "max_action_dim": spec.max_action_dim,
        "resize_imgs_with_padding": resize, "empty_cameras": max(0, spec.num_images - len(cameras)),
        "tokenizer_max_length": spec.tokenizer_max_length, "num_steps": spec.num_steps, "use_cache": True,
        "vlm_model_name": SMOLVLM2_500M if default_vlm else VLM, "load_vlm_weights": False,
        "add_image_special_tokens": spec.add_image_special_tokens, "attention_mode": spec.attention_mode,
        "prefix_length": spec.prefix_length, "pad_language_to": "longest",
        "num_expert_layers": spec.num_expert_layers, "num_vlm_layers": spec.num_vlm_layers,
        "self_attn_every_n_layers": spec.self_attn_every_n_layers,
        "expert_width_multiplier": spec.expert_width_multiplier, "min_period": spec.min_period,
        "max_period": spec.max_period,
    }


def vlm_config(spec: SmolVLASpec) -> dict[str, Any]:
    """transformers' SmolVLM config.json of the spec's VLM (what LeRobot reads its shapes from)."""
    v, t = spec.vision, spec.text
    return {
        "model_type": "smolvlm", "scale_factor": spec.scale_factor, "tie_word_embeddings": t.tie_word_embeddings,
        "text_config": {"model_type": "llama", "hidden_size": t.width, "intermediate_size": t.mlp_dim,
                        "num_hidden_layers": t.depth, "num_attention_heads": t.num_heads,
                        "num_key_value_heads": t.num_kv_heads, "head_dim": t.head_dim, "vocab_size": t.vocab_size,
                        "rms_norm_eps": t.rms_norm_eps, "hidden_act": "silu", "attention_bias": False,
                        "mlp_bias": False, "tie_word_embeddings": t.tie_word_embeddings},
        "vision_config": {"model_type": "smolvlm_vision", "hidden_size": v.width, "intermediate_size": v.mlp_dim,
                          "num_hidden_layers": v.depth, "num_attention_heads": v.num_heads,
                          "image_size": v.image_size, "patch_size": v.patch_size, "layer_norm_eps": v.layer_norm_eps,
                          "hidden_act": "gelu_pytorch_tanh", "num_channels": 3},
    }


def processor_config(spec: SmolVLASpec) -> dict[str, Any]:
    """transformers' SmolVLM processor config of the spec's tower (LeRobot's model builds the VLM's processor, though
    its policy prepares the images itself)."""
    image = {"image_processor_type": "SmolVLMImageProcessor", "do_convert_rgb": True, "do_image_splitting": False,
             "do_normalize": True, "do_pad": True, "do_rescale": True, "do_resize": True,
             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 1,
             "rescale_factor": 1 / 255, "size": {"longest_edge": spec.vision.image_size},
             "max_image_size": {"longest_edge": spec.vision.image_size}}
    video = {**{k: v for k, v in image.items() if k not in ("image_processor_type", "do_image_splitting")},
             "video_processor_type": "SmolVLMVideoProcessor", "do_sample_frames": False, "return_metadata": False}
    return {"processor_class": "SmolVLMProcessor", "image_seq_len": spec.tokens_per_image, "image_processor": image,
            "video_processor": video}


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
