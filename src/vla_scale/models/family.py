"""`PolicyFamily`: what the rest of the trainer knows of a policy family, read from its folder's `family.py`.

A family's folder (`models/<name>/`) describes itself with one record, light enough to import without torch: the
name `model.family` takes, its own `model.<name>.*` keys (a settings dataclass, as a simulator's `env.<name>.*`),
where its translation from the run's `model.*` keys to a `PolicySource` lives, and how its checkpoint folders are
told apart. `models/registry.py` lists the records; the config schema, its checks, `run_policy` and
`models/families.checkpoint_family` read them from there and name no family themselves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PolicyFamily:
    name: str
    """What `model.family` says; also the folder's name and its settings group's (`model.<name>.*`)."""
    title: str
    """How messages name it (OpenVLA-OFT, π0)."""
    run: str
    """The module (dotted path) that turns the run's `model.*` keys into the family's source, imported on first use
    (it builds weights)."""
    source: str = "source_for_env"
    """Its function `(model, env, explicit) -> PolicySource` on an env, raising ConfigError naming each key that does
    not fit."""
    resolved: str = "resolved_model_config"
    """Its function `(source, base) -> ModelConfig`: the `model.*` keys of the policy a run holds."""
    settings: type | None = None
    """Dataclass of the family's own keys (`model.<name>.*`), or None. Its class attributes `BOUNDS` (key -> bound,
    as `config/checks.BOUNDS`) and `CHOICES` (a function returning key -> allowed values, imported when the check
    runs) and its method `problems()` (what its fields contradict) are read by `config/checks.py`."""
    lerobot_types: dict[str, str] = field(default_factory=dict)
    """LeRobot policy `type`s (a folder's config.json) this family reads -> the checkpoint's variant (a name of
    `variants`)."""
    lerobot_weights: str = ""
    """The root every weight name of such a LeRobot folder starts with, after LeRobot's `model.`."""
    variants: dict[str, str] = field(default_factory=dict)
    """Checkpoint variants the family loads -> their titles (π0's `pi05`: π0.5); the family itself is one."""

    def titles(self) -> dict[str, str]:
        """Every checkpoint variant's title, the family's own first."""
        return {self.name: self.title, **self.variants}

    def source_for_env(self) -> Callable[..., Any]:
        return getattr(importlib.import_module(self.run), self.source)

    def resolved_model_config(self) -> Callable[..., Any]:
        return getattr(importlib.import_module(self.run), self.resolved)
