"""Flow-Noise's noise head: the small network that gives each denoising step's std (`objectives/flow_noise.py`).

It reads the action expert's output rows at the actions [B, H, expert width] (after the expert's final norm: what
`action_out_proj` reads) and gives a std float32 [B, H, action_dim] in [std_min, std_max]. Shape and bounds follow
RLinf's noise head for flow policies (rlinf/models/embodiment/modules/explore_noise_net.py: its `ExploreNoiseNet` on
the expert's width, hidden layers 128 and 64 with tanh, one output per action dim, and `noise_logvar_range`
[0.08, 0.16] as the std bounds). Its init is the policy's (normal(0, 0.02) weights, zero biases), so a fresh head
starts near the geometric mean of the bounds everywhere; RLinf keeps torch's default init.

It is a child module of the policy (`noise_head.*` parameters), built only when a run chooses Flow-Noise, so ZeRO-3,
the weight sync and DeepSpeed's checkpoint carry it with the rest. A checkpoint folder keeps it beside the weights in
`noise_head.safetensors`, so that `model.safetensors` stays the upstream layout (which the upstream code loads as it
is) and a policy without a head (evaluation, a Flow-SDE run) ignores the file.
"""

from __future__ import annotations

from torch import Tensor, nn

from vla_scale.objectives.flow_noise import bounded_std

PREFIX = "noise_head."
"""Its parameters' names in the policy (the attribute `FlowPolicy.noise_head`)."""
FILE = "noise_head.safetensors"
"""A checkpoint folder's file of the head's tensors, under their names in the policy."""
HIDDEN = (128, 64)
"""The hidden layers' widths (RLinf's noise head)."""
STD_BOUNDS = (0.08, 0.16)
"""Default (std_min, std_max), RLinf's `noise_logvar_range`."""


class NoiseHead(nn.Module):
    """An MLP (tanh between layers) from the expert's width to the action size, its outputs squashed into stds."""

    def __init__(self, width: int, action_dim: int, std_min: float, std_max: float):
        super().__init__()
        if not 0.0 < std_min <= std_max:
            raise ValueError(f"Flow-Noise's std bounds need 0 < std_min <= std_max, got {std_min} and {std_max}")
        self.std_min, self.std_max = std_min, std_max
        widths = (width, *HIDDEN)
        layers: list[nn.Module] = []
        for inner, outer in zip(widths[:-1], widths[1:], strict=True):
            layers += [nn.Linear(inner, outer), nn.Tanh()]
        self.net = nn.Sequential(*layers, nn.Linear(widths[-1], action_dim))

    def forward(self, rows: Tensor) -> Tensor:
        """std float32 [..., H, action_dim] of the expert's output rows [..., H, width]."""
        first = self.net[0]
        assert isinstance(first, nn.Linear)
        return bounded_std(self.net(rows.to(first.weight.dtype)), self.std_min, self.std_max)
