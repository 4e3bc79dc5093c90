"""An algorithm is one module of `algo/` and one config file: the registry finds every one by its module's name, the
configs build them, nothing outside `algo/` and `config/` names one, and docs/ARCHITECTURE.md's "Adding an algorithm"
names each one's files."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import vla_scale.algo as algo_package
from vla_scale.algo.base import Algorithm
from vla_scale.algo.registry import NOT_ALGORITHMS, algorithm_class, algorithm_names, make_algorithm
from vla_scale.config import Config, ConfigError, register_configs, to_config, validate

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "vla_scale"
CONFIGS = ROOT / "configs"


def load(*overrides: str) -> Config:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return to_config(compose(config_name="config", overrides=list(overrides)))


def test_every_module_of_algo_that_defines_an_algorithm_is_registered_under_its_name() -> None:
    modules = {info.name for info in pkgutil.iter_modules(algo_package.__path__)} - set(NOT_ALGORITHMS)
    assert set(algorithm_names()) == modules == {"grpo", "ppo", "rloo"}
    for name in algorithm_names():
        cls = algorithm_class(name)
        assert issubclass(cls, Algorithm) and cls.name == name


@pytest.mark.parametrize("file", sorted(p.stem for p in (CONFIGS / "algo").glob("*.yaml")))
def test_every_shipped_algo_config_builds_its_algorithm(file: str) -> None:
    cfg = load(f"algo={file}")
    validate(cfg)
    algorithm = make_algorithm(cfg.algo)
    assert algorithm.name == cfg.algo.name and algorithm.settings is cfg.algo
    assert file.split("_")[0] == cfg.algo.name  # grpo_scratch.yaml is grpo's


@pytest.mark.parametrize("name", ["grpo", "ppo", "rloo"])
def test_each_algorithm_has_its_config_file(name: str) -> None:
    assert (CONFIGS / "algo" / f"{name}.yaml").read_text().count(f"name: {name}") == 1


def test_an_unknown_algorithm_is_refused_with_the_names() -> None:
    cfg = load("algo.name=reinforce")
    with pytest.raises(ConfigError, match=r"algo.name.*reinforce.*grpo.*ppo.*rloo"):
        validate(cfg)
    with pytest.raises(ValueError, match="unknown algorithm 'reinforce'"):
        algorithm_class("reinforce")


def _names_in_code(path: Path, names: set[str]) -> list[str]:
    """The string constants (not docstrings) equal to an algorithm's name, and every `has_critic`, in `path`."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings:
            found.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value!r}")
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
        if name == "has_critic":
            found.append(f"{path.relative_to(SRC)}:{node.lineno}: has_critic")
    return found


def test_no_code_outside_algo_and_config_names_an_algorithm() -> None:
    """The trainer, the batches and the actor hold no branch on the algorithm: they ask `Algorithm`."""
    names = set(algorithm_names())
    outside = [p for p in SRC.rglob("*.py") if p.parent.name not in ("algo", "config")]
    assert len(outside) > 50
    assert [hit for path in outside for hit in _names_in_code(path, names)] == []
    rloo = [p for p in SRC.rglob("*.py") if "rloo" in p.read_text().lower() and p.name != "rloo.py"]
    assert rloo == []  # the third algorithm is its module (and its config file) alone


def test_the_architecture_page_names_each_algorithms_files() -> None:
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = page.split("### Adding an algorithm", 1)[1].split("\n### ", 1)[0]
    for name in algorithm_names():
        assert f"`algo/{name}.py`" in section and f"`configs/algo/{name}.yaml`" in section, name
