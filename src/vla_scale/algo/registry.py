"""Every RL algorithm by name: the modules of `algo/` that define `ALGORITHM` (an `algo/base.Algorithm` class), the
module's name being the algorithm's (`algo.name`). A new algorithm is one module here and one `configs/algo/*.yaml`;
nothing else names it. Knows no config."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import Any

import vla_scale.algo as package
from vla_scale.algo.base import Algorithm

NOT_ALGORITHMS = ("base", "registry")
"""The modules of `algo/` that define no algorithm."""


@cache
def algorithm_names() -> tuple[str, ...]:
    """The names `algo.name` takes, sorted."""
    names = [info.name for info in pkgutil.iter_modules(package.__path__) if info.name not in NOT_ALGORITHMS]
    return tuple(sorted(name for name in names if hasattr(_module(name), "ALGORITHM")))


def _module(name: str) -> Any:
    return importlib.import_module(f"{package.__name__}.{name}")


def algorithm_class(name: str) -> type[Algorithm]:
    """The class of the algorithm `name`; a ValueError naming the known ones when there is none."""
    if name not in algorithm_names():
        raise ValueError(f"unknown algorithm {name!r}: choose one of {list(algorithm_names())}")
    found = _module(name).ALGORITHM
    if not (isinstance(found, type) and issubclass(found, Algorithm) and found.name == name):
        raise TypeError(f"algo/{name}.py's ALGORITHM must be an Algorithm subclass named {name!r}, got {found!r}")
    return found


def make_algorithm(settings: Any) -> Algorithm:
    """The algorithm `settings.name` names, holding `settings` (the run's `algo.*`)."""
    return algorithm_class(settings.name)(settings)
