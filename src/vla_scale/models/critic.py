"""The critic of PPO: a value head on the policy's backbone, the module the actor trains when it has one, and the
value head's file in a checkpoint folder.

The value head is an MLP on a hidden state the policy gives (`value_features`): OpenVLA-OFT's Llama backbone's last
hidden state (as RLinf's critic reads it) at the row of the last prompt token (`prompt_last`, the row that reads the
first action slot) or averaged over the rows the action slots are read from (`action_mean`); π0's PaliGemma prefix
after its final norm, at the last valid prefix row (`prompt_last`) or averaged over the valid prefix rows
(`action_mean`: the rows every denoising step attends to). `PolicyWithValue` holds the policy and the head as one
module, so one DeepSpeed engine (one ZeRO-3 partitioning, one optimizer) trains both; the rollout engine, the weight
sync and the policy's own checkpoint files see the policy alone. A checkpoint folder keeps the head beside the
policy as `value_head.safetensors` (its position and width in the file's metadata), a file the policy's loaders
never read.
"""

from __future__ import annotations

import os
from typing import Any

from torch import Tensor, nn

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

    def forward(self, features: Tensor) -> Tensor:
        """The values float32 [B] of the hidden states [B, D] the policy read at `position`."""
        return self.net(features).squeeze(-1).float()


def read_rows(rows: Tensor, position: str, valid: Tensor | None = None) -> Tensor:
    """The hidden state [B, D] a value head reads from rows [B, K, D] ordered so that row 0 is `prompt_last`'s:
    row 0, or the mean over the rows (over those `valid` bool[B, K] marks, when given)."""
    if position == "prompt_last":
        return rows[:, 0]
    if valid is None:
        return rows.mean(dim=1)
    weights = valid.to(rows.dtype)[..., None]
    return (rows * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)


class PolicyWithValue(nn.Module):
    """The policy and its value head as the one module the actor's DeepSpeed engine trains. The policy's
    `value_features(*args, position=, **kwargs)` gives its forward's output and the hidden state the head reads, from
    one backbone pass (OFT: `OFTPolicy.forward`'s distribution parameters; π0: `Pi0Policy.chain_logprobs`'s)."""

    def __init__(self, policy: nn.Module, value_head: ValueHead):
        super().__init__()
        self.policy, self.value_head = policy, value_head

    def forward(self, *args: Any, detach_backbone: bool = False, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """(the policy's output, the values float32 [B]). `detach_backbone`: the value loss reaches the value head
        only."""
        out, features = self.policy.value_features(*args, position=self.value_head.position, **kwargs)
        return out, self.value_head(features.detach() if detach_backbone else features)


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
