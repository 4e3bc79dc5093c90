"""Trainer checkpoints: the DeepSpeed engine (weights + optimizer), consolidated safetensors weights, RNG states.

Layout: `<run_dir>/checkpoints/step_<k>/` holds DeepSpeed's files, `model.safetensors`, and one
`trainer_state_rank<r>.json` per rank (step, policy version, sampler, rollout and RNG states, the next step's task
specs), written as plain JSON: a checkpoint is data, never code. `<run_dir>/checkpoints/latest` names the newest
complete step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from vla_scale.envs.types import TaskSpec
from vla_scale.parallel.weight_sync import gathered_buckets


def rng_state() -> dict[str, Any]:
    """The global RNG states (python, numpy, torch) as JSON-ready values."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state().tolist(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def write_trainer_state(directory: str, rank: int, state: dict[str, Any]) -> None:
    """One JSON file per rank; tensors become lists, task specs dicts."""
    def encode(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return {"__tensor_uint8__": value.tolist()}
        if isinstance(value, TaskSpec):
            return {"__task__": dataclasses.asdict(value)}
        if isinstance(value, dict):
            return {k: encode(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [encode(v) for v in value]
        return value

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"trainer_state_rank{rank}.json"), "w") as f:
        json.dump(encode(state), f)


def read_trainer_state(directory: str, rank: int) -> dict[str, Any]:
    path = os.path.join(directory, f"trainer_state_rank{rank}.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: resume with the same number of ranks that saved the checkpoint")

    def decode(value: Any) -> Any:
        if isinstance(value, dict):
            if "__tensor_uint8__" in value:
                return torch.tensor(value["__tensor_uint8__"], dtype=torch.uint8)
            if "__task__" in value:
                return TaskSpec(**value["__task__"])
            return {k: decode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [decode(v) for v in value]
        return value

    with open(path) as f:
        return decode(json.load(f))


def checkpoint_root(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def latest_tag(run_dir: str) -> str | None:
    path = os.path.join(checkpoint_root(run_dir), "latest")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read().strip()


def save_weights(module: torch.nn.Module, path: str, bucket_mb: float, write: bool) -> None:
    """Consolidated weights as safetensors (gathered bucket by bucket; only the writing rank keeps copies)."""
    tensors: dict[str, torch.Tensor] = {}
    for bucket in gathered_buckets(module, bucket_mb):
        if write:
            tensors.update((name, t.detach().cpu().clone()) for name, t in bucket)
    if write:
        save_file(tensors, path)


def mark_latest(run_dir: str, tag: str) -> None:
    tmp = os.path.join(checkpoint_root(run_dir), "latest.tmp")
    with open(tmp, "w") as f:
        f.write(tag)
    os.replace(tmp, os.path.join(checkpoint_root(run_dir), "latest"))


RUN_CONFIG = "run_config.json"
"""Beside each checkpoint's trainer state: the model and algorithm it was trained with and its number of ranks."""


def write_run_config(directory: str, model: Any, algo: Any, ranks: int) -> None:
    """What a resumed run must match (`resume_problems`); dataclasses as plain JSON."""
    data = {"model": dataclasses.asdict(model), "algo": dataclasses.asdict(algo), "ranks": ranks}
    with open(os.path.join(directory, RUN_CONFIG), "w") as f:
        json.dump(data, f, indent=1)


def resume_problems(run_dir: str, model: Any, algo: Any, ranks: int) -> list[str]:
    """Why `run_dir` cannot be resumed with this model, algorithm and number of ranks (empty when it can): no
    checkpoint, a `latest` naming a missing step, or any model / algo field or the rank count differing from what
    the run trained with. `model.checkpoint` (where the initial weights came from) may move."""
    root = checkpoint_root(run_dir)
    tag = latest_tag(run_dir)
    if tag is None:
        return [f"resume=true but {root} has no checkpoint: point run_dir at a run that saved one, or drop resume=true"]
    if not os.path.isdir(os.path.join(root, tag)):
        return [f"{os.path.join(root, 'latest')} names {tag!r}, which is not in {root}: restore it or point latest "
                "at a step that exists"]
    path = os.path.join(root, tag, RUN_CONFIG)
    if not os.path.exists(path):
        return []  # saved before run configs were recorded: nothing to compare
    with open(path) as f:
        saved = json.load(f)
    problems = []
    for group, now in (("model", dataclasses.asdict(model)), ("algo", dataclasses.asdict(algo))):
        for key, value in now.items():
            if key != "checkpoint" and key in saved[group] and saved[group][key] != _plain(value):
                problems.append(f"{group}.{key}={_plain(value)!r} but the run trained with {saved[group][key]!r}: "
                                f"resume with {group}.{key}={saved[group][key]!r}, or start a new run_dir")
    if saved["ranks"] != ranks:
        problems.append(f"the run trained on {saved['ranks']} rank(s), this command has {ranks}: resume with the "
                        "same number of ranks")
    return problems


def _plain(value: Any) -> Any:
    """A value as JSON gives it back (tuples become lists)."""
    return json.loads(json.dumps(value))
