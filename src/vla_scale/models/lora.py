"""LoRA adapters on the policy's linear layers: the actor trains only them; engines and checkpoints get merged weights.

An adapted `nn.Linear` keeps its name and its (frozen) weight and gains two child layers, `lora_A` (weight [r, in])
and `lora_B` (weight [out, r]), PEFT's names: y = W x + b + s B A x with s = alpha / r. Child modules rather than
bare parameters, so that ZeRO-3 builds them under `zero.Init` and gathers them like any layer (also inside a
checkpointed block's recompute). B starts at zero, so an adapted policy starts as its base. The rollout
engine runs the merged weight W + s B A (`merged`: float32 arithmetic, rounded once to the weight's dtype): it needs
no LoRA code, and its fast path stays as it is. Every consumer of gathered weights gets them merged with the adapters
left out (`OFTPolicy.served`: the weight sync, `model.safetensors` of a checkpoint), so a LoRA run's step folder loads
as any other policy; the adapters alone go into the same folder in PEFT's layout (`write_adapters`:
adapter_config.json, adapter_model.safetensors with `base_model.model.<module>.lora_A.weight` keys), the layout of
OpenVLA-OFT's and RLinf's LoRA checkpoints, which `merge_adapters` reads back into any policy of the same base.

Merged weights travel instead of the adapters because the engine would otherwise need the base weights and the merged
ones side by side (twice its memory) or merge in place by differences (not bit-exact); docs/performance.md has what
the merged sync costs at 7B.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from typing import Protocol

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

LORA_ALL_LINEAR = "all-linear"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv", "proj", "fc1",
                "fc2", "fc3")
"""The linear layers adapters can go on, by last name: Llama's attention and MLP, the ViT blocks' attention and MLP,
the projectors' layers (the LM head never: its action rows are what the loss reads)."""

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
NOT_ADAPTED = ("lm_head",)  # its action rows are what the loss reads: trained or frozen whole, never low-rank
FULLY_TRAINED = ("action_head", "action_noise", "action_in_proj", "action_out_proj", "state_proj",
                 "action_time_mlp_in", "action_time_mlp_out", "time_mlp_in", "time_mlp_out", "noise_head")
"""Parts a LoRA run trains whole, never low-rank: OFT's L1 head and its Gaussian's log-std (small; OpenVLA-OFT's LoRA
fine-tuning trains its action head whole too); π0's projections of actions, state and time in and out of the action
expert (small and the robot's own; openpi's LoRA fine-tunes freeze only the Gemmas' weights) and Flow-Noise's noise
head (small, and fresh when RL starts)."""
FILM_PROJECTIONS = ("scale", "shift")
"""A FiLMed vision block's projections of the language embedding, also trained whole (OpenVLA-OFT adds them after
the adapters)."""


def _trained_whole(module_path: str) -> bool:
    parts = module_path.split(".")
    return parts[0] in FULLY_TRAINED or (parts[0] == "vision_backbone" and parts[-1] in FILM_PROJECTIONS)


class AdapterShape(Protocol):
    """What adapters are made with (the run's `model.lora`)."""

    rank: int
    alpha: float
    target_modules: list[str]


class LoRAFactor(nn.Module):
    """One factor of an adapter: a bias-free linear map, Kaiming-uniform (A, PEFT's default) or zero (B) at init."""

    def __init__(self, in_features: int, out_features: int, zero: bool, device: torch.device, dtype: torch.dtype):
        super().__init__()
        weight = torch.zeros(out_features, in_features, device=device, dtype=torch.float32)
        if not zero:
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        self.weight = nn.Parameter(weight.to(dtype))

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.linear(x, self.weight)


class LoRALinear(nn.Linear):
    """`nn.Linear` plus a low-rank update (`add_adapters` turns a built layer into one, its weight untouched)."""

    lora_A: LoRAFactor
    lora_B: LoRAFactor
    lora_scaling: float

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) + self.lora_B(self.lora_A(x)) * self.lora_scaling


def scaling(lora: AdapterShape) -> float:
    return lora.alpha / lora.rank


def targets(policy: nn.Module, names: list[str]) -> list[tuple[str, nn.Linear]]:
    """The linear layers `names` select (module docstring), in module order."""
    chosen = []
    for path, module in policy.named_modules():
        last = path.rsplit(".", 1)[-1]
        whole = _trained_whole(path)
        if type(module) is nn.Linear and not whole and last not in NOT_ADAPTED and (LORA_ALL_LINEAR in names or
                                                                                   last in names):
            chosen.append((path, module))
    return chosen


def add_adapters(policy: nn.Module, lora: AdapterShape) -> list[str]:
    """Give the layers `lora.target_modules` selects adapters of rank `lora.rank` and freeze every other parameter
    but the `FULLY_TRAINED` parts; returns the adapted layers' names. Under ZeRO-3 call it inside the `zero.Init` the
    policy was built in (its weights then are shards: the shapes come from `ds_shape`), so the adapters are built as
    shards too."""
    chosen = targets(policy, lora.target_modules)
    if not chosen:
        raise ValueError(f"model.lora.target_modules={lora.target_modules} selects no linear layer of this policy")
    for name, param in policy.named_parameters():
        param.requires_grad_(_trained_whole(name.rsplit(".", 1)[0]))
    for _, module in chosen:
        out_features, in_features = getattr(module.weight, "ds_shape", module.weight.shape)
        device, dtype = module.weight.device, module.weight.dtype
        module.__class__ = LoRALinear
        module.lora_A = LoRAFactor(in_features, lora.rank, False, device, dtype)
        module.lora_B = LoRAFactor(lora.rank, out_features, True, device, dtype)
        module.lora_scaling = scaling(lora)
    policy.lora_scaling = scaling(lora)
    _inputs_require_grad(policy)
    return [name for name, _ in chosen]


def _inputs_require_grad(policy: nn.Module) -> None:
    """Mark what the frozen entry layers (the towers' patch embeddings, the token embeddings) output as needing
    gradients. With the whole base frozen nothing upstream of the first adapter would, and ZeRO-3 re-gathers a
    block's weights for the backward pass (and activation checkpointing recomputes it) only where its inputs carry
    gradients: the backward through the frozen weights then finds them released."""
    def require_grad(_module: nn.Module, _inputs: object, output: Tensor) -> Tensor:
        return output.requires_grad_(True) if torch.is_grad_enabled() and not output.requires_grad else output

    for name, module in policy.named_modules():
        if name.endswith("patch_embed") or isinstance(module, nn.Embedding):
            module.register_forward_hook(require_grad)


def merged(weight: Tensor, a: Tensor, b: Tensor, scale: float) -> Tensor:
    """W + scale * B A, computed in float32 and rounded once to W's dtype."""
    return (weight.float() + scale * (b.float() @ a.float())).to(weight.dtype)


class ServesMerged:
    """What a policy class mixes in to serve its gathered weights merged (`served`, what the weight sync and the
    checkpoint folders call); `add_adapters` sets `lora_scaling`."""

    lora_scaling: float | None = None

    def served(self, bucket: list[tuple[str, Tensor]]) -> list[tuple[str, Tensor]]:
        """Gathered (name, tensor) of this policy as a rollout engine or a checkpoint holds them: with LoRA adapters
        each adapted weight merged and the adapters left out, else as they are."""
        return bucket if self.lora_scaling is None else served(bucket, self.lora_scaling)


def is_adapter(name: str) -> bool:
    return name.endswith((".lora_A.weight", ".lora_B.weight"))


def served(bucket: list[tuple[str, Tensor]], scale: float) -> list[tuple[str, Tensor]]:
    """Gathered (name, tensor) of a policy with adapters -> as a plain policy holds them: each adapted weight merged,
    the adapters left out. A layer's weight and adapters must be in the same bucket (the sync keeps a layer's
    parameters and its adapters' together)."""
    factors = {name: t for name, t in bucket if is_adapter(name)}
    out = []
    for name, tensor in bucket:
        if is_adapter(name):
            continue
        layer = name.removesuffix(".weight")
        if f"{layer}.lora_A.weight" in factors:
            tensor = merged(tensor, factors[f"{layer}.lora_A.weight"], factors[f"{layer}.lora_B.weight"], scale)
        out.append((name, tensor))
    return out


def write_adapters(folder: str, adapters: dict[str, Tensor], lora: AdapterShape, base: str = "") -> None:
    """The adapters alone, in PEFT's layout (module docstring); `adapters` by our parameter names."""
    os.makedirs(folder, exist_ok=True)
    tensors = {f"{PEFT_PREFIX}{name}": t.detach().cpu().contiguous() for name, t in adapters.items()}
    save_file(tensors, os.path.join(folder, ADAPTER_WEIGHTS))
    layers = sorted({name.rsplit(".", 3)[-3] for name in adapters})
    config = {"peft_type": "LORA", "r": lora.rank, "lora_alpha": lora.alpha, "target_modules": layers,
              "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "base_model_name_or_path": base}
    with open(os.path.join(folder, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=1)


def read_adapters(folder: str) -> tuple[dict[str, tuple[Tensor, Tensor]], float]:
    """{layer name: (A, B)} and the scale of an adapter folder in PEFT's layout (ours, OpenVLA-OFT's, RLinf's)."""
    config_path, weights_path = os.path.join(folder, ADAPTER_CONFIG), os.path.join(folder, ADAPTER_WEIGHTS)
    try:
        with open(config_path) as f:
            config = json.load(f)
        tensors = load_file(weights_path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{folder} is not a readable adapter folder ({err}): it needs {ADAPTER_CONFIG} and "
                         f"{ADAPTER_WEIGHTS}") from err
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{config_path}: peft_type {config.get('peft_type')!r} is not LORA")
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    pairs: dict[str, tuple[Tensor, Tensor]] = {}
    for key, tensor in tensors.items():
        if ".lora_A." in key:
            layer = key.removeprefix(PEFT_PREFIX).split(".lora_A.")[0]
            b_key = key.replace(".lora_A.", ".lora_B.")
            if b_key not in tensors:
                raise ValueError(f"{weights_path}: {key} has no {b_key}")
            pairs[layer] = (tensor, tensors[b_key])
    if not pairs:
        raise ValueError(f"{weights_path} holds no lora_A/lora_B tensors")
    return pairs, scale


def merge_adapters(policy: nn.Module, folder: str, zero3: bool = False) -> int:
    """Merge an adapter folder into `policy`'s weights in place (ZeRO-3: each weight gathered on rank 0, then spread);
    returns how many layers changed. A layer it names that the policy lacks, or of another shape, is an error."""
    pairs, scale = read_adapters(folder)
    modules = dict(policy.named_modules())
    for layer, (a, b) in pairs.items():
        module = modules.get(layer)
        if not isinstance(module, nn.Linear):
            raise ValueError(f"{folder}: adapter for {layer!r}, which is no linear layer of this policy (another "
                             "base model?)")
        shape = tuple(getattr(module.weight, "ds_shape", module.weight.shape))
        if shape != (b.shape[0], a.shape[1]):
            raise ValueError(f"{folder}: adapter for {layer} is {b.shape[0]}x{a.shape[1]}, the layer {shape}")
        if zero3:
            import deepspeed

            context = deepspeed.zero.GatheredParameters([module.weight], modifier_rank=0)
        else:
            context = contextlib.nullcontext()
        with context, torch.no_grad():
            if module.weight.numel():
                module.weight.copy_(merged(module.weight, a.to(module.weight.device), b.to(module.weight.device),
                                           scale))
    return len(pairs)
