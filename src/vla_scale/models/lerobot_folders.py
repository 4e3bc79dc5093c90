"""LeRobot's policy folders beside the weights: the pre- and post-processor pipelines (`policy_preprocessor.json`,
`policy_postprocessor.json`) whose normaliser steps carry the dataset statistics in safetensors files, read and
written as LeRobot 0.4+'s `save_pretrained` lays them out; what every family with a LeRobot layout shares.

    policy_preprocessor.json          {"name", "steps": [{"registry_name", "config", "state_file"?}, ...]}: the input
                                      pipeline; its `normalizer_processor` step names its statistics file
    policy_preprocessor_step_<i>_normalizer_processor.safetensors   `observation.state.<stat>`, `action.<stat>`
    policy_postprocessor.json         the output pipeline; `unnormalizer_processor`'s file holds `action.<stat>`
    policy_postprocessor_step_0_unnormalizer_processor.safetensors

Statistics are returned as openpi names them (`state`, `actions`: `models/flow/normalize.NormStats`) and written as
float64 (LeRobot reads any float), so a round trip is exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file as load_numpy
from safetensors.numpy import save_file as save_numpy

from vla_scale.models.families import CheckpointFolderError, read_json
from vla_scale.models.flow.normalize import NormStats

PREPROCESSOR, POSTPROCESSOR = "policy_preprocessor", "policy_postprocessor"
LEROBOT_KEYS = {"observation.state": "state", "action": "actions"}
"""LeRobot's feature names -> openpi's norm-stats keys."""
LEROBOT_MODES = {"MEAN_STD": "zscore", "QUANTILES": "quantile"}
"""LeRobot's normalisation modes that our two rules match; IDENTITY, MIN_MAX and QUANTILE10 do not."""
DEVICE_STEP = {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}
NORMALISERS = ("normalizer_processor", "unnormalizer_processor")


def read_processor_stats(folder: Path) -> dict[str, NormStats]:
    """State and action statistics from the pre-processor's normaliser (actions also from the post-processor's)."""
    files = [normaliser_file(folder, PREPROCESSOR, "normalizer_processor"),
             normaliser_file(folder, POSTPROCESSOR, "unnormalizer_processor")]
    if not any(files):
        raise CheckpointFolderError(
            f"{folder} has no normalisation statistics: looked for {PREPROCESSOR}.json's normalizer_processor step and "
            f"its {PREPROCESSOR}_step_<i>_normalizer_processor.safetensors (and {POSTPROCESSOR}'s unnormalizer): "
            "copy the processor files LeRobot saved beside the policy")
    by_feature: dict[str, dict[str, list[float]]] = {}
    for file in files:
        if file is None:
            continue
        try:
            flat = load_numpy(str(file))
        except Exception as error:  # safetensors raises its own error types
            raise CheckpointFolderError(f"{file} is not a safetensors file of statistics: {error}") from None
        for name, values in flat.items():
            feature, stat = name.rsplit(".", 1)
            if feature in LEROBOT_KEYS:
                by_feature.setdefault(feature, {}).setdefault(stat, values.astype(np.float64).reshape(-1).tolist())
    lacking = sorted(set(LEROBOT_KEYS) - set(by_feature))
    if lacking:
        raise CheckpointFolderError(f"{folder}: the processor statistics lack {lacking} (found "
                                    f"{sorted(by_feature) or 'none'} in {[str(f) for f in files if f]})")
    try:
        return {LEROBOT_KEYS[f]: NormStats.from_json(stats) for f, stats in by_feature.items()}
    except ValueError as error:
        raise CheckpointFolderError(f"{folder}: processor statistics: {error}") from None


def normaliser_file(folder: Path, pipeline: str, step: str) -> Path | None:
    """The statistics file of `pipeline`.json's `step`, or of its name pattern when the JSON is absent."""
    if (folder / f"{pipeline}.json").exists():
        for entry in read_json(folder / f"{pipeline}.json").get("steps", []):
            if entry.get("registry_name") == step and entry.get("state_file"):
                path = folder / entry["state_file"]
                if not path.exists():
                    raise CheckpointFolderError(f"{folder}/{pipeline}.json names {entry['state_file']}, which is "
                                                "missing: copy it from where the policy was saved")
                return path
        return None
    matches = sorted(folder.glob(f"{pipeline}_step_*_{step}.safetensors"))
    return matches[0] if matches else None


def normaliser_step(features: dict[str, Any], mode: str, name: str = "normalizer_processor") -> dict[str, Any]:
    """A (un)normaliser step of LeRobot's pipelines: images as they are, state and actions by `mode` (a key of
    LEROBOT_MODES' values: zscore or quantile)."""
    lerobot_mode = {v: k for k, v in LEROBOT_MODES.items()}[mode]
    return {"registry_name": name, "config": {"eps": 1e-8, "features": features,
                                               "norm_map": {"VISUAL": "IDENTITY", "STATE": lerobot_mode,
                                                            "ACTION": lerobot_mode}}}


def tokenizer_step(max_length: int, tokenizer_name: str, padding: str) -> dict[str, Any]:
    """LeRobot's tokenizer step of the pre-processor (the task's text into ids, right-padded)."""
    return {"registry_name": "tokenizer_processor",
            "config": {"max_length": max_length, "task_key": "task", "padding_side": "right", "padding": padding,
                       "truncation": True, "tokenizer_name": tokenizer_name}}


def write_pipelines(folder: Path, steps: list[dict[str, Any]], stats: dict[str, NormStats]) -> None:
    """The pre-processor of `steps` and the post-processor (unnormaliser of the same config, device), each
    normaliser's statistics in its own file."""
    flat: dict[str, np.ndarray] = {}
    for feature, key in LEROBOT_KEYS.items():
        for stat, values in stats[key].to_json().items():
            if values is not None:
                flat[f"{feature}.{stat}"] = np.asarray(values, dtype=np.float64)
    actions_only = {k: v for k, v in flat.items() if k.startswith("action.")}
    norm = next(step for step in steps if step["registry_name"] == "normalizer_processor")
    post = [{"registry_name": "unnormalizer_processor", "config": norm["config"]}, DEVICE_STEP]
    for name, pipeline, kept in ((PREPROCESSOR, steps, flat), (POSTPROCESSOR, post, actions_only)):
        written = []
        for i, step in enumerate(pipeline):
            if step["registry_name"] in NORMALISERS:
                step = step | {"state_file": f"{name}_step_{i}_{step['registry_name']}.safetensors"}
                save_numpy(kept, str(folder / step["state_file"]))
            written.append(step)
        (folder / f"{name}.json").write_text(json.dumps({"name": name, "steps": written}, indent=2) + "\n")
