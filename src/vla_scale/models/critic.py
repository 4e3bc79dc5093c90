"""The critic of PPO: a value head on the policy's backbone, the module the actor trains when it has one, and the
value head's file in a checkpoint folder.

The value head is an MLP on the Llama backbone's last hidden state (as RLinf's critic reads OpenVLA-OFT's): at the
row of the last prompt token (`prompt_last`, the row that reads the first action slot) or averaged over the rows the
action slots are read from (`action_mean`). `PolicyWithValue` holds the policy and the head as one module, so one
DeepSpeed engine (one ZeRO-3 partitioning, one optimizer) trains both; the rollout engine, the weight sync and the
policy's own checkpoint files see the policy alone. A checkpoint folder keeps the head beside the policy as
`value_head.safetensors` (its position and width in the file's metadata), a file the policy's loaders never read.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:  # the configuration's checks import this module's names: no Llama imported for them
    from vla_scale.models.policy import OFTPolicy, PolicyInputs
    from vla_scale.models.processor import PreparedInputs

CRITIC_POSITIONS = ("prompt_last", "action_mean")
"""Where the value head reads the backbone (`algo.critic.position`)."""

VALUE_HEAD_FILE = "value_head.safetensors"
"""The value head's file in a checkpoint folder."""


class ValueHead(nn.Module):
    """hidden state [B, D] -> value [B]: two GELU layers of `width`, then one output. The output layer starts at zero,
    so a fresh critic predicts 0 everywhere and its first updates do not push noise into a shared backbone."""

    def __init__(self, hidden_size: int, width: int, position: str):
        super().__init__()
        if position not in CRITIC_POSITIONS:
            raise ValueError(f"unknown critic position {position!r}; choose one of {CRITIC_POSITIONS}")
        self.position = position
        self.net = nn.Sequential(nn.Linear(hidden_size, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                                 nn.Linear(width, 1))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def read(self, action_rows: Tensor) -> Tensor:
        """The hidden state the head reads, [B, D], from the action rows' states [B, K, D]: row 0 is the last prompt
        token's (it reads slot 0)."""
        return action_rows[:, 0] if self.position == "prompt_last" else action_rows.mean(dim=1)

    def forward(self, action_rows: Tensor) -> Tensor:
        return self.net(self.read(action_rows)).squeeze(-1).float()


class PolicyWithValue(nn.Module):
    """The policy and its value head as the one module the actor's DeepSpeed engine trains."""

    def __init__(self, policy: OFTPolicy, value_head: ValueHead):
        super().__init__()
        self.policy, self.value_head = policy, value_head

    def forward(self, inputs: PolicyInputs | PreparedInputs, device: torch.device | None = None, trim: bool = False,
                detach_backbone: bool = False) -> tuple[Tensor, Tensor]:
        """(the policy's distribution parameters, as `OFTPolicy.forward` gives them; the values float32 [B]) from one
        backbone pass. `detach_backbone`: the value loss reaches the value head only."""
        params, rows = self.policy.head_outputs(inputs, device, trim)
        return params, self.value_head(rows.detach() if detach_backbone else rows)


def value_head_file(folder: str) -> str | None:
    """The folder's value head file, None without one."""
    path = os.path.join(folder, VALUE_HEAD_FILE)
    return path if os.path.isfile(path) else None


def save_value_head(state: dict[str, Tensor], position: str, width: int, folder: str) -> None:
    """The gathered value head (`net.*` tensors) as `value_head.safetensors`, its position and width in the
    metadata."""
    from safetensors.torch import save_file

    save_file({name: t.contiguous() for name, t in state.items()}, os.path.join(folder, VALUE_HEAD_FILE),
              metadata={"position": position, "width": str(width)})


def read_value_head(folder: str) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The folder's value head tensors and metadata (`save_value_head`)."""
    from safetensors import safe_open

    path = os.path.join(folder, VALUE_HEAD_FILE)
    with safe_open(path, framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}, dict(f.metadata() or {})


def value_head_problems(folder: str, hidden_size: int, width: int, position: str) -> list[str]:
    """Why the folder's value head cannot start this run's critic (empty when it can, or when there is none): an
    unreadable file, another position or width, tensors of another shape."""
    if not folder or value_head_file(folder) is None:
        return []
    path = os.path.join(folder, VALUE_HEAD_FILE)
    try:
        tensors, meta = read_value_head(folder)
    except Exception as err:  # safetensors raises its own error types for a damaged file
        return [f"{path} is unreadable ({err}): remove it to start a fresh critic, or restore the file"]
    problems = []
    if meta.get("position", position) != position:
        problems.append(f"{path} was trained at algo.critic.position={meta['position']}, this run asks for "
                        f"{position}: set algo.critic.position={meta['position']}")
    expected = {name: tuple(p.shape) for name, p in ValueHead(hidden_size, width, position).named_parameters()}
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if shapes != expected:
        saved_width = meta.get("width", "?")
        held = ", ".join(f"{name} {list(shape)}" for name, shape in sorted(shapes.items())[:2])
        problems.append(f"{path} does not fit a value head of width {width} on a backbone of width {hidden_size} "
                        f"(it holds width {saved_width}: {held}, ...): set algo.critic.width={saved_width}, or "
                        "remove the file to start a fresh critic")
    return problems
