"""Which policy family a checkpoint folder holds, told from its files alone (no tensor is read, no torch imported).

Three families, four layouts:

    family  layout    what marks it
    oft     openvla   config.json of an OpenVLA model (`model_type: openvla`, `vision_backbone_id`, `timm_model_ids`
                      or `llm_backbone_id`); weights named `language_model.*`, `vision_backbone.*`
    pi0     openpi    weights named `paligemma_with_expert.*` with π0's `state_proj` / `action_time_mlp_in`;
    pi05              π0.5's `time_mlp_in` and no `state_proj` (openpi's conversion writes a config.json that does
                      not say which, so the weights decide)
    pi0     lerobot   config.json with LeRobot's `"type": "pi0"` / `"pi05"`; the same weights under `model.`
    pi05

The config and the weights must agree: a π0 config over OFT weights (or the reverse), or a LeRobot "pi05" over π0's
weights, is refused, naming both. The weights' names come from the safetensors headers (`weight_shapes`), which
also give every shape, so a folder's shapes can be checked against its config before any weight is built.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vla_scale.models.family import PolicyFamily
from vla_scale.models.registry import FAMILIES, checkpoint_titles

CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
LEROBOT_PREFIX = "model."
"""LeRobot's policies hold openpi's `PI0Pytorch` as `self.model`, so every weight name starts with it."""
PI0_ROOT = "paligemma_with_expert."
OFT_ROOTS = ("language_model.", "vision_backbone.")
OPENVLA_SIGNS = ("vision_backbone_id", "timm_model_ids", "llm_backbone_id")
LEROBOT_TYPES = {t: (record, variant) for record in FAMILIES.values() for t, variant in record.lerobot_types.items()}
"""LeRobot's policy `type` -> the family that reads it and the checkpoint variant it is (the registry's records)."""

Family = str
"""A checkpoint variant: a family's name, or one of its `variants` (π0.5's `pi05`)."""
Layout = Literal["openpi", "lerobot", "openvla"]
FAMILY_NAMES = checkpoint_titles()
LAYOUT_NAMES = {"openpi": "openpi layout", "lerobot": "LeRobot layout", "openvla": "official OpenVLA layout"}
MAX_HEADER = 100 * 2**20
"""A safetensors header longer than this is taken for a file of another kind."""


class CheckpointFolderError(ValueError):
    """A checkpoint folder that cannot be read as it is; the message names the problem and what to change."""


@dataclass(frozen=True)
class FamilyFound:
    """What `checkpoint_family` found, and the sentence that says so."""

    family: Family
    layout: Layout
    note: str
    asset_id: str | None = None
    """openpi layout: the `assets/<asset_id>` whose norm stats were read (set by the folder's reader)."""
    n_action_steps: int | None = None
    """LeRobot layout: the actions of each chunk the policy plays before it decodes again (`n_action_steps`)."""


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointFolderError(f"{path} is not readable JSON ({error}): replace it with the file the "
                                    "checkpoint was saved with") from None
    if not isinstance(data, dict):
        raise CheckpointFolderError(f"{path} holds a JSON {type(data).__name__}, not an object")
    return data


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files: those `model.safetensors.index.json` maps, else `model.safetensors`."""
    if (folder / INDEX).exists():
        weight_map = read_json(folder / INDEX).get("weight_map") or {}
        return [folder / name for name in sorted(set(weight_map.values()))]
    if (folder / WEIGHTS).exists():
        return [folder / WEIGHTS]
    raise CheckpointFolderError(f"{folder} has neither {WEIGHTS} nor {INDEX}: point at the folder that holds the "
                                "checkpoint's weights")


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: name -> {dtype, shape, data_offsets} (and `__metadata__`)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 0 < size <= MAX_HEADER:
                raise ValueError("no safetensors header")
            header = json.loads(f.read(size))
    except (OSError, ValueError) as error:
        raise CheckpointFolderError(f"{path} is not a safetensors file ({error}): save the weights with "
                                    "safetensors") from None
    if not isinstance(header, dict):
        raise CheckpointFolderError(f"{path} is not a safetensors file (its header is not an object)")
    return header


def weight_shapes(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """Every weight's name and shape, as the folder stores them (read from the headers; no tensor data)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in weight_files(Path(folder)):
        if not file.exists():
            raise CheckpointFolderError(f"{file} is missing ({INDEX} names it): copy the whole checkpoint")
        shapes.update({name: tuple(entry["shape"]) for name, entry in safetensors_header(file).items()
                       if name != "__metadata__"})
    return shapes


def pi0_variant(names: set[str]) -> Family | None:
    """π0 or π0.5 from openpi's parameter names (without LeRobot's prefix); None when neither shows."""
    if "state_proj.weight" in names or "action_time_mlp_in.weight" in names:
        return "pi0"
    if "time_mlp_in.weight" in names:
        return "pi05"
    return None


def _examples(names: set[str] | list[str], n: int = 4) -> str:
    listed = sorted(names)
    return ", ".join(listed[:n]) + (f" ... ({len(listed)} in all)" if len(listed) > n else "") if listed else "none"


def checkpoint_family(folder: str | Path) -> FamilyFound:
    """The family and layout of the checkpoint in `folder` (module docstring), or CheckpointFolderError naming what
    does not fit. Reads config.json and the safetensors headers only."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointFolderError(f"no checkpoint folder at {folder}: pass the folder that holds config.json and "
                                    f"{WEIGHTS}")
    config = read_json(folder / CONFIG) if (folder / CONFIG).exists() else {}
    names = set(weight_shapes(folder))
    lerobot_type = config.get("type")
    prefixed = bool(names) and all(n.startswith(LEROBOT_PREFIX) for n in names)
    bare = {n.removeprefix(LEROBOT_PREFIX) for n in names} if prefixed else names
    pi0_keys = {n for n in bare if n.startswith(PI0_ROOT)}
    oft_keys = {n for n in bare if n.startswith(OFT_ROOTS)}
    openvla_config = config.get("model_type") == "openvla" or any(k in config for k in OPENVLA_SIGNS)

    if lerobot_type is not None:
        if lerobot_type not in LEROBOT_TYPES:
            raise CheckpointFolderError(
                f"{folder} is a LeRobot {lerobot_type!r} policy; vla_scale reads LeRobot's "
                f"{sorted(LEROBOT_TYPES)} policies and OpenVLA-OFT checkpoints: convert it or pick another checkpoint")
        record, family = LEROBOT_TYPES[lerobot_type]
        said = f"config.json says LeRobot type {lerobot_type!r}"
        if record.lerobot_weights == PI0_ROOT:
            _check_pi0_weights(folder, said, family, bare, pi0_keys, oft_keys)
        else:
            _check_lerobot_weights(folder, said, record, bare)
        if not prefixed:
            raise CheckpointFolderError(f"{folder}: a LeRobot policy's weights are named `{LEROBOT_PREFIX}...`, these "
                                        f"are not (e.g. {_examples(names, 2)}): save it with LeRobot, or as an "
                                        "openpi folder (no `type` in config.json)")
        return found(family, "lerobot", f"type {lerobot_type!r}")
    if openvla_config:
        if pi0_keys:
            raise CheckpointFolderError(
                f"{folder}: config.json is an OpenVLA model's but the weights are π0's ({_examples(pi0_keys, 2)}): "
                "the folder mixes two checkpoints; put the π0 weights beside their own config.json")
        if not oft_keys:
            raise CheckpointFolderError(f"{folder}: config.json is an OpenVLA model's but no weight is named "
                                        f"{' / '.join(OFT_ROOTS)} (found {_examples(names)})")
        return found("oft", "openvla", "")
    if pi0_keys or "paligemma_variant" in config or "action_expert_variant" in config:
        variant = pi0_variant(bare)
        if variant is None and not oft_keys:
            raise CheckpointFolderError(
                f"{folder}: π0 weights without `state_proj` / `action_time_mlp_in` (π0) or `time_mlp_in` (π0.5), so "
                "the family cannot be told: the weights are incomplete; copy the whole model.safetensors")
        _check_pi0_weights(folder, "config.json is openpi's (paligemma_variant)" if not pi0_keys else "the weights",
                           variant or "pi0", bare, pi0_keys, oft_keys)
        assert variant is not None
        if prefixed:
            raise CheckpointFolderError(
                f"{folder}: the weights are named `{LEROBOT_PREFIX}...` as in LeRobot's policies, but config.json has "
                f"no LeRobot `type`: add `\"type\": \"{variant}\"` (LeRobot layout) or save the weights without the "
                "prefix (openpi layout)")
        return found(variant, "openpi", "")
    raise CheckpointFolderError(
        f"{folder} holds no checkpoint vla_scale knows: config.json keys {_examples(set(config))}, weights "
        f"{_examples(names)}. Known are OpenVLA-OFT folders (OpenVLA config.json, `language_model.` / "
        "`vision_backbone.` weights), openpi's π0 / π0.5 PyTorch folders (`paligemma_with_expert.` weights) and "
        f"LeRobot's {' / '.join(f'`{t}`' for t in LEROBOT_TYPES)} policies (config.json `type`)")


def _check_pi0_weights(folder: Path, said: str, family: Family, names: set[str], pi0_keys: set[str],
                       oft_keys: set[str]) -> None:
    """A folder whose config says π0 / π0.5 must hold π0 weights of that family and none of OFT's."""
    if oft_keys:
        raise CheckpointFolderError(
            f"{folder}: {said} ({FAMILY_NAMES[family]}) but it holds OpenVLA-OFT weights ({_examples(oft_keys, 2)}): "
            "an OFT checkpoint needs its OpenVLA config.json; a π0 one its own model.safetensors")
    if not pi0_keys:
        raise CheckpointFolderError(f"{folder}: {said} ({FAMILY_NAMES[family]}) but no weight is named "
                                    f"`{PI0_ROOT}...` (found {_examples(names)}): copy the policy's model.safetensors")
    variant = pi0_variant(names)
    if variant is not None and variant != family:
        raise CheckpointFolderError(
            f"{folder}: {said} ({FAMILY_NAMES[family]}) but the weights are {FAMILY_NAMES[variant]}'s "
            f"({'time_mlp_in' if variant == 'pi05' else 'state_proj'}): fix config.json's type to "
            f"{variant!r}, or use the weights that belong to it")


def _check_lerobot_weights(folder: Path, said: str, record: PolicyFamily, names: set[str]) -> None:
    """A LeRobot folder of a family other than π0 must hold weights under the family's root, and no other family's."""
    root = record.lerobot_weights
    foreign = {n for n in names if n.startswith((PI0_ROOT, *OFT_ROOTS))}
    if foreign or not any(n.startswith(root) for n in names):
        raise CheckpointFolderError(
            f"{folder}: {said} ({record.title}) but no weight is named `{LEROBOT_PREFIX}{root}...` (found "
            f"{_examples(foreign or names)}): copy the policy's own model.safetensors beside its config.json")


def found(family: Family, layout: Layout, detail: str) -> FamilyFound:
    """The record and its sentence, e.g. "π0.5 checkpoint, LeRobot layout (type 'pi05')"."""
    note = f"{FAMILY_NAMES[family]} checkpoint, {LAYOUT_NAMES[layout]}" + (f" ({detail})" if detail else "")
    return FamilyFound(family=family, layout=layout, note=note)
