"""Trainer checkpoints: the DeepSpeed engine (weights + optimizer), consolidated safetensors weights, RNG states.

Layout: `<run_dir>/checkpoints/step_<k>/` holds DeepSpeed's files, one `trainer_state_rank<r>.json` per rank (step,
policy version, sampler, rollout and RNG states, the next step's task specs), written as plain JSON: a checkpoint is
data, never code, and the policy as a checkpoint folder of its own (`models/oft/checkpoint_io.py`'s official layout:
config.json, model.safetensors, the proprio projector's side file, statistics, preprocessor config, tokenizer files),
so `model.checkpoint=<step folder>` (or `=<run_dir>`) loads it like any OpenVLA-OFT folder.
`<run_dir>/checkpoints/latest` names the newest complete step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import resource
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from vla_scale.envs.types import TaskSpec
from vla_scale.models.checkpoint_folders import LATEST, RUN_CHECKPOINTS
from vla_scale.models.oft.checkpoint_io import write_folder
from vla_scale.parallel.ranks import mean_over_ranks
from vla_scale.parallel.sync.weight_sync import gathered_buckets

if TYPE_CHECKING:
    from vla_scale.models.interface import PolicySource
    from vla_scale.parallel.actor import Actor


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
    return os.path.join(run_dir, RUN_CHECKPOINTS)


def latest_tag(run_dir: str) -> str | None:
    path = os.path.join(checkpoint_root(run_dir), LATEST)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read().strip()


def gathered_weights(module: torch.nn.Module, bucket_mb: float, write: bool) -> dict[str, torch.Tensor]:
    """The policy's weights gathered bucket by bucket as the engines get them (a LoRA policy's merged), copied on the
    host by the writing rank only (the others take part in the gathers and keep nothing)."""
    tensors: dict[str, torch.Tensor] = {}
    for bucket in gathered_buckets(module, bucket_mb):
        if write:
            tensors.update((name, t.detach().cpu().clone()) for name, t in bucket)
    return tensors


def save_policy_folder(module: torch.nn.Module, folder: str, tokenizer: Any, bucket_mb: float, write: bool) -> None:
    """An OFT policy as a checkpoint folder (`checkpoint_io.write_folder` and the tokenizer's files), its weights
    gathered (`gathered_weights`)."""
    tensors = gathered_weights(module, bucket_mb, write)
    if write:
        preprocessor = module.preprocessor or module.image_transform().preprocessor_config()
        write_folder(tensors, module.spec, preprocessor, folder)
        tokenizer.save(folder)


def save_adapters(module: torch.nn.Module, folder: str, lora: Any, bucket_mb: float, write: bool, base: str) -> None:
    """A LoRA policy's adapters alone, in PEFT's layout (`models/lora.write_adapters`), gathered like the weights."""
    from vla_scale.models.lora import is_adapter, write_adapters

    adapters: dict[str, torch.Tensor] = {}
    for bucket in gathered_buckets(module, bucket_mb, only=is_adapter):
        if write:
            adapters.update((name, t.detach().cpu().clone()) for name, t in bucket)
    if write:
        write_adapters(folder, adapters, lora, base)


def save_value_head_file(head: Any, folder: str, bucket_mb: float, write: bool) -> None:
    """The value head as `value_head.safetensors` (`models/critic.save_value_head`), gathered like the weights."""
    from vla_scale.models.critic import save_value_head

    tensors: dict[str, torch.Tensor] = {}
    for bucket in gathered_buckets(head, bucket_mb):
        if write:
            tensors.update((name, t.detach().float().cpu().clone()) for name, t in bucket)
    if write:
        save_value_head(tensors, head.position, head.net[0].out_features, folder)


PARTIAL = ".partial"
"""A step folder being written carries this suffix until every rank has written its part."""


class CheckpointWriteError(OSError):
    """A checkpoint that could not be written; the message names the path, the bytes it needs and what stays."""


def partial_tag(tag: str) -> str:
    return tag + PARTIAL


def remove_folder(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)


def publish(run_dir: str, partial: str, tag: str) -> None:
    """The written `partial` folder becomes `tag` (replacing an older one of that name) and `latest` names it; each
    move is a rename, so `latest` names either the previous checkpoint or this complete one."""
    root = checkpoint_root(run_dir)
    remove_folder(os.path.join(root, tag))
    os.replace(os.path.join(root, partial), os.path.join(root, tag))
    mark_latest(run_dir, tag)


def write_checkpoint(run_dir: str, step: int, actor: Actor, vla: PolicySource, state: dict[str, Any],
                     groups: dict[str, Any], bucket_mb: float, lora: Any,
                     on_device: Callable[[], AbstractContextManager[None]] = nullcontext, env: Any = None) -> None:
    """Step `step`'s checkpoint, the same for the RL and the supervised run: DeepSpeed's files, this rank's `state`,
    the run's config `groups` (`write_run_config`), the policy as a checkpoint folder (and a LoRA policy's adapters
    alone), written into `step_<k>.partial` and renamed to `step_<k>` only when every rank has written its part, then
    named by `latest`: a run killed at any point leaves `latest` naming a complete checkpoint. A write that fails (a
    full disk, a file-size limit) removes the partial folder and raises `CheckpointWriteError` naming the path and
    the bytes needed; the previous checkpoint stays latest. `on_device`: where the optimizer state must be while
    DeepSpeed saves it. `env`: the env config the policy trained on, kept beside the groups (what an evaluation
    renders it at: `run_setup.trained_resolution`; a resume does not compare it). Every rank calls it."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    tag, root = f"step_{step}", checkpoint_root(run_dir)
    partial = partial_tag(tag)
    folder = os.path.join(root, partial)
    if rank == 0:
        remove_folder(folder)  # left by a run killed while writing it
    _barrier(world)
    problem = space_problem(run_dir, actor.policy) if rank == 0 else ""
    if mean_over_ranks(float(bool(problem)), world, actor.device) > 0:  # every rank stops before a collective
        raise CheckpointWriteError(problem or "rank 0 cannot write the checkpoint (its error says why)")
    try:
        with on_device():
            actor.save(root, partial, {"step": step})
        write_trainer_state(folder, rank, state)
        if rank == 0:
            write_run_config(folder, groups, world, env)
        tensors = gathered_weights(actor.policy, bucket_mb, rank == 0)
        if rank == 0:  # the policy's family writes its own layout (`models/interface.PolicySource`)
            vla.write_folder(actor.policy, tensors, folder)
        if actor.adapted:  # the adapters alone too, in PEFT's layout
            save_adapters(actor.policy, folder, lora, bucket_mb, rank == 0, vla.source)
        if actor.value_head is not None:  # the critic beside the policy (`models/critic.py`)
            save_value_head_file(actor.value_head, folder, bucket_mb, rank == 0)
    except (OSError, RuntimeError) as err:  # torch.save reports a failed write as a RuntimeError
        raise write_failure(run_dir, folder, err, actor.policy) from err
    _barrier(world)
    if rank == 0:
        publish(run_dir, partial, tag)


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def space_problem(run_dir: str, module: torch.nn.Module) -> str:
    """Why the next checkpoint cannot be written, seen before writing it ('' when it can): fewer bytes free in the
    run directory than it needs, or a file-size limit on this process below its largest file."""
    total, largest = needed_bytes(run_dir, module)
    free = shutil.disk_usage(run_dir).free
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if free < total:
        return _refusal(run_dir, f"{free} bytes are free in {run_dir}", total, largest)
    if soft != resource.RLIM_INFINITY and soft < largest:
        return _refusal(run_dir, f"this process may write files of at most {soft} bytes (`ulimit -f`)", total,
                        largest)
    return ""


def write_failure(run_dir: str, folder: str, err: Exception, module: torch.nn.Module) -> CheckpointWriteError:
    """The error for a checkpoint write that failed: the partial folder removed, the path that failed, the bytes
    needed, what stays latest."""
    remove_folder(folder)
    total, largest = needed_bytes(run_dir, module)
    where = getattr(err, "filename", None) or folder
    return CheckpointWriteError(_refusal(run_dir, f"writing {where} failed ({err})", total, largest))


def needed_bytes(run_dir: str, module: torch.nn.Module) -> tuple[int, int]:
    """(bytes, largest file) of the next checkpoint: the latest one's, else estimated from the parameters (weights
    twice, in DeepSpeed's module states and model.safetensors, plus fp32 master weights and Adam moments)."""
    tag = latest_tag(run_dir)
    previous = os.path.join(checkpoint_root(run_dir), tag) if tag else ""
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(previous) for f in files] if previous \
        else []
    if sizes:
        return sum(sizes), max(sizes)
    weights = trainable = 0
    for p in module.parameters():
        n = int(getattr(p, "ds_numel", p.numel()))
        weights += n * p.element_size()
        trainable += n if p.requires_grad else 0
    return 2 * weights + 12 * trainable, 12 * trainable


def _refusal(run_dir: str, why: str, total: int, largest: int) -> str:
    tag = latest_tag(run_dir)
    kept = f"{tag} stays the latest checkpoint, untouched" if tag else "no earlier checkpoint exists"
    return (f"cannot write the checkpoint: {why}; it needs about {total} bytes ({total / 2**20:.1f} MiB), its "
            f"largest file about {largest} bytes; {kept}. Free space or raise the limit, then continue with "
            "resume=true")


def mark_latest(run_dir: str, tag: str) -> None:
    tmp = os.path.join(checkpoint_root(run_dir), "latest.tmp")
    with open(tmp, "w") as f:
        f.write(tag)
    os.replace(tmp, os.path.join(checkpoint_root(run_dir), LATEST))


RUN_CONFIG = "run_config.json"
TRAINED_ENV = "trained_env"
"""The key of run_config.json holding the env config the policy trained on."""
"""Beside each checkpoint's trainer state: the config groups it was trained with (the RL run's `model` and `algo`,
supervised fine-tuning's `model` and `sft`) and its number of ranks."""


def write_run_config(directory: str, groups: dict[str, Any], ranks: int, env: Any = None) -> None:
    """What a resumed run must match (`resume_problems`): each config group (name -> dataclass) as plain JSON; and
    the env trained on (`env`, under its own key) for what reads the checkpoint later."""
    data = {**{name: dataclasses.asdict(group) for name, group in groups.items()}, "ranks": ranks}
    if env is not None:
        data[TRAINED_ENV] = dataclasses.asdict(env)
    with open(os.path.join(directory, RUN_CONFIG), "w") as f:
        json.dump(data, f, indent=1)


def latest_step(run_dir: str) -> int | None:
    """The step the `latest` checkpoint holds (from its `step_<k>` name), None without one."""
    tag = latest_tag(run_dir)
    if tag is None or not tag.startswith("step_") or not tag[5:].isdigit():
        return None
    return int(tag[5:])


def read_json(path: str) -> tuple[Any, str]:
    """(the parsed file, "") or (None, one sentence saying which file is broken and what to do)."""
    try:
        with open(path) as f:
            return json.load(f), ""
    except (OSError, ValueError) as err:
        return None, f"{path} is unreadable ({err}): the checkpoint is damaged; point checkpoints/latest at an " \
                     "earlier step or start a new run_dir"


def config_differences(saved: dict[str, Any], group: str, now: Any, may_differ: tuple[str, ...] = ("checkpoint",)
                       ) -> list[str]:
    """One line per field of `now` (a config dataclass) that differs from `saved` (that group as JSON); fields in
    `may_differ` are not compared (`checkpoint`, where initial weights came from, may move)."""
    return [f"{group}.{key}={_plain(value)!r} but the run trained with {saved[key]!r}: use {group}.{key}="
            f"{saved[key]!r}, or start a new run_dir"
            for key, value in dataclasses.asdict(now).items()
            if key not in may_differ and key in saved and saved[key] != _plain(value)]


def resume_problems(run_dir: str, groups: dict[str, Any], ranks: int, may_differ: tuple[str, ...] = ("checkpoint",)
                    ) -> list[str]:
    """Why `run_dir` cannot be resumed with these config groups (name -> dataclass, as `write_run_config` saved
    them) and number of ranks (empty when it can): no checkpoint, a `latest` naming a missing step, a missing or
    unreadable state file, a group the run did not save, or any field of a group or the rank count differing from
    what the run trained with (but the fields named in `may_differ`). Reads files only; writes none."""
    root = checkpoint_root(run_dir)
    tag = latest_tag(run_dir)
    if tag is None:
        return [f"resume=true but {root} has no checkpoint: point run_dir at a run that saved one, or drop resume=true"]
    step_dir = os.path.join(root, tag)
    if not os.path.isdir(step_dir) or latest_step(run_dir) is None:
        return [f"{os.path.join(root, 'latest')} names {tag!r}, which is not a step folder in {root}: restore it or "
                "write the name of a step that exists (e.g. step_<k>) into that file"]
    saved = None
    if os.path.exists(os.path.join(step_dir, RUN_CONFIG)):  # absent in steps saved before run configs were written
        saved, problem = read_json(os.path.join(step_dir, RUN_CONFIG))
        if problem:
            return [problem]
    problems = []
    if saved is not None:
        for name, group in groups.items():
            if name not in saved:
                kinds = sorted(set(saved) - {"ranks", "model"})
                problems.append(f"{run_dir} was not written by this kind of run (its checkpoint holds "
                                f"{', '.join(kinds)}, not {name}): start a new run_dir, or load its policy with "
                                f"model.checkpoint={run_dir}")
            else:
                problems += config_differences(saved[name], name, group, may_differ)
        if saved["ranks"] != ranks:
            problems.append(f"the run trained on {saved['ranks']} rank(s), this command has {ranks}: resume with the "
                            "same number of ranks")
    for rank in range(ranks if not problems else 0):
        state = os.path.join(step_dir, f"trainer_state_rank{rank}.json")
        if not os.path.exists(state):
            problems.append(f"{state} is missing: resume with the number of ranks that saved {tag}")
        elif problem := read_json(state)[1]:
            problems.append(problem)
    if not problems and not any(name.endswith("model_states.pt") for name in os.listdir(step_dir)):
        problems.append(f"{step_dir} has no DeepSpeed model states (*model_states.pt): the save did not finish; point "
                        "checkpoints/latest at an earlier step")
    return problems


def _plain(value: Any) -> Any:
    """A value as JSON gives it back (tuples become lists)."""
    return json.loads(json.dumps(value))
