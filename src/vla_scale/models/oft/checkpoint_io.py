"""Reading and writing OpenVLA-OFT checkpoint folders, official layout, as data only (nothing in them is executed).

A folder holds `config.json` (OpenVLAConfig fields, plus our `vla_scale` section when we wrote it),
`model.safetensors` or shards with `model.safetensors.index.json` (official parameter names, which are ours too),
`proprio_projector--<step>_checkpoint.pt` and, for an L1-regression fine-tune, `action_head--<step>_checkpoint.pt`
(plain state dicts, keys possibly prefixed `module.` by DDP, loaded with `torch.load(weights_only=True)`),
`dataset_statistics.json` and `preprocessor_config.json`. The official `.py` files that `trust_remote_code` would
import are never needed.

`read_spec` gives a folder's `OFTSpec`; `OFTPolicy.from_spec` builds the policy of that spec without random
init and `load_weights` copies the folder's tensors in. Under ZeRO-3 (`zero3_init=True`, built inside
`deepspeed.zero.Init`) every tensor is copied into its gathered parameter on rank 0 and scattered from there.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterator
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vla_scale.models.checkpoint_folders import copy_tensors
from vla_scale.models.oft.spec import OFTSpec, openvla_config, spec_from_openvla

CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
STATS, PREPROCESSOR = "dataset_statistics.json", "preprocessor_config.json"
PROPRIO_PREFIX = "proprio_projector."
HEAD_PREFIX = "action_head."
"""Our parameter names of the L1-regression head (`models/oft/action_heads.py`); its side file holds them without it."""
OPTIONAL = ("action_noise.log_std",)
"""Parameters a folder may lack, kept at their init: an official L1 fine-tune has no Gaussian log-std (RL adds it)."""


def _read_json(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def _write_json(path: str, data: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def proprio_projector_file(path: str) -> str | None:
    """The proprio projector side file: the only one, else 'latest', else the highest step."""
    files = glob.glob(os.path.join(path, "proprio_projector--*checkpoint.pt"))
    if len(files) <= 1:
        return files[0] if files else None
    latest = [f for f in files if "latest" in os.path.basename(f)]
    steps = [(int(m.group(1)), f) for f in files if (m := re.search(r"--(\d+)_checkpoint\.pt$", f))]
    return latest[0] if latest else max(steps)[1]


def load_proprio_state(path: str) -> dict[str, torch.Tensor] | None:
    """The proprio projector's state dict (`fc1.*`, `fc2.*`), or None when the folder has none."""
    file = proprio_projector_file(path)
    if file is None:
        return None
    state = torch.load(file, map_location="cpu", weights_only=True)
    return {k.removeprefix("module."): v for k, v in state.items()}


def action_head_files(path: str) -> list[str]:
    """The folder's `action_head--<step>_checkpoint.pt` files (an L1-regression or diffusion head)."""
    return sorted(glob.glob(os.path.join(path, "action_head--*checkpoint.pt")))


def film_backbone_files(path: str) -> list[str]:
    """`vision_backbone--*` files: OpenVLA-OFT's FiLM recipe (`use_film`) saves its whole FiLMed vision backbone
    there, LoRA adapters unmerged, beside a model.safetensors whose towers are not the ones it acts with."""
    return sorted(glob.glob(os.path.join(path, "vision_backbone--*checkpoint.pt")))


def diffusion_files(path: str) -> list[str]:
    """`noisy_action_projector--*` files: only OpenVLA-OFT's diffusion recipe (`use_diffusion`) saves them."""
    return sorted(glob.glob(os.path.join(path, "noisy_action_projector--*checkpoint.pt")))


def load_action_head_state(path: str) -> dict[str, torch.Tensor] | None:
    """The action head's state dict by its module's names (`model.fc1.weight`, ...; a DDP `module.` prefix
    dropped), or None when the folder has no head file. More than one file is an error (which one trained with the
    weights beside it cannot be told)."""
    files = action_head_files(path)
    if not files:
        return None
    if len(files) > 1:
        raise ValueError(f"{path} holds {len(files)} action head files ({', '.join(map(os.path.basename, files))}): "
                         "keep the one that belongs to this folder's weights")
    state = torch.load(files[0], map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise ValueError(f"{files[0]} is not a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in state.items()}


def read_proprio_dim(path: str) -> int | None:
    """The input size of the folder's proprio projector (None: it has none)."""
    state = load_proprio_state(path)
    return state["fc1.weight"].shape[1] if state else None


def read_spec(path: str, proprio_dim: int | None = None, files: dict[str, Any] | None = None,
              **overrides: Any) -> OFTSpec:
    """The spec of the checkpoint in `path` (config.json, with dataset_statistics.json when norm_stats is absent; the
    action head the folder's files say, unless `overrides` name it). `files`: those JSON files already parsed, by
    name (the others are read here)."""
    overrides.setdefault("action_head", "l1" if action_head_files(path) else "tokens")
    files = files or {}
    config = dict(files.get(CONFIG) or _read_json(os.path.join(path, CONFIG)))
    if not config.get("norm_stats") and (STATS in files or os.path.exists(os.path.join(path, STATS))):
        config["norm_stats"] = files.get(STATS) or _read_json(os.path.join(path, STATS))
    return spec_from_openvla(config, proprio_dim=proprio_dim, **overrides)


def weight_files(path: str) -> list[str]:
    index = os.path.join(path, INDEX)
    if os.path.exists(index):
        return [os.path.join(path, f) for f in sorted(set(_read_json(index)["weight_map"].values()))]
    if os.path.exists(os.path.join(path, WEIGHTS)):
        return [os.path.join(path, WEIGHTS)]
    raise FileNotFoundError(f"{path} has neither {WEIGHTS} nor {INDEX}")


def iter_tensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every (name, tensor) of the checkpoint, one at a time (the proprio projector under `proprio_projector.`)."""
    for file in weight_files(path):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
    proprio = load_proprio_state(path)
    for name, tensor in (proprio or {}).items():
        yield PROPRIO_PREFIX + name, tensor
    for name, tensor in (load_action_head_state(path) or {}).items():
        yield HEAD_PREFIX + name, tensor


def load_weights(policy: torch.nn.Module, path: str, zero3_init: bool = False) -> None:
    """Copy the checkpoint's tensors into `policy` (an `OFTPolicy` of the folder's spec; strict: every parameter, no
    stray tensor) and keep its preprocessor_config.json on it."""
    if os.path.exists(os.path.join(path, PREPROCESSOR)):
        policy.preprocessor = _read_json(os.path.join(path, PREPROCESSOR))
    copy_tensors(policy, iter_tensors(path), zero3_init, optional=OPTIONAL)


def save_policy(policy: Any, path: str, max_shard_gb: float = 5.0) -> None:
    """Write the folder `load_weights` reads (see the module docstring) for an `OFTPolicy`, which must not be ZeRO-3
    sharded."""
    state = {n: p.detach().contiguous().cpu() for n, p in policy.named_parameters()}
    write_folder(state, policy.spec, policy.preprocessor or policy.image_transform().preprocessor_config(), path,
                 max_shard_gb)


def write_folder(state: dict[str, torch.Tensor], spec: OFTSpec, preprocessor: dict[str, Any], path: str,
                 max_shard_gb: float = 5.0) -> None:
    """The folder `read_spec` and `load_weights` read, from a policy's named tensors (by parameter name, on the CPU),
    its spec and its preprocessor_config.json: the weights (the proprio projector in its side file), config.json, the
    dataset statistics and the preprocessor config. The tokenizer files are the tokenizer's to write."""
    os.makedirs(path, exist_ok=True)
    state = dict(state)
    sides = {prefix: {"module." + n.removeprefix(prefix): state.pop(n) for n in list(state) if n.startswith(prefix)}
             for prefix in (PROPRIO_PREFIX, HEAD_PREFIX)}
    _save_shards(state, path, int(max_shard_gb * 2**30))
    for prefix, side in sides.items():  # the official side files: DDP-prefixed state dicts
        stem = prefix.removesuffix(".")
        for old in glob.glob(os.path.join(path, f"{stem}--*checkpoint.pt")):
            os.remove(old)
        if side:
            torch.save(side, os.path.join(path, f"{stem}--latest_checkpoint.pt"))
    config = openvla_config(spec)
    config["torch_dtype"] = str(next(iter(state.values())).dtype).removeprefix("torch.")
    _write_json(os.path.join(path, CONFIG), config)
    if spec.norm_stats:
        _write_json(os.path.join(path, STATS), spec.norm_stats)
    _write_json(os.path.join(path, PREPROCESSOR), preprocessor)


def _save_shards(state: dict[str, torch.Tensor], path: str, max_bytes: int) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    for old in glob.glob(os.path.join(path, "model*.safetensors")) + glob.glob(os.path.join(path, INDEX)):
        os.remove(old)
    if len(shards) == 1:
        save_file(shards[0], os.path.join(path, WEIGHTS), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in state.values())
    _write_json(os.path.join(path, INDEX), {"metadata": {"total_size": total}, "weight_map": weight_map})
