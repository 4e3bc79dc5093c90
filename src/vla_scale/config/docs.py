"""docs/CONFIG.md, generated from the schemas' field docstrings and the values the shipped presets set (`configs/`):
`python -m vla_scale.config.docs > docs/CONFIG.md`."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

from omegaconf import OmegaConf

from vla_scale.config import schema
from vla_scale.envs.registry import SIMULATORS
from vla_scale.models.registry import FAMILIES

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
"""The shipped YAML files: `config.yaml` (the default run) and one folder per group of presets."""


def field_docs(module: ModuleType = schema, names: tuple[str, ...] = ()) -> dict[str, list[tuple[str, str, str, str]]]:
    """{schema class: [(field, type, default, docstring)]} read from the field docstrings of `module`'s classes
    (`config/schema.py`'s `*Config` ones, or those `names` names)."""
    tree = ast.parse(inspect.getsource(module))
    docs: dict[str, list[tuple[str, str, str, str]]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or not (node.name in names or not names and node.name.endswith("Config")):
            continue
        rows = docs.setdefault(node.name, [])
        for stmt, nxt in zip(node.body, node.body[1:] + [None], strict=True):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and not ast.unparse(stmt.annotation).startswith("ClassVar")):
                doc = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) else ""
                default = ast.unparse(stmt.value) if stmt.value is not None else ""
                rows.append((stmt.target.id, ast.unparse(stmt.annotation), default, " ".join(str(doc).split())))
    return docs


def settings_docs(cls: type) -> list[tuple[str, str, str, str]]:
    """A settings dataclass's rows: its own fields, then those it inherits (from the modules that declare them)."""
    rows: list[tuple[str, str, str, str]] = []
    for base in [c for c in cls.__mro__ if dataclasses.is_dataclass(c)]:
        rows += field_docs(inspect.getmodule(base), (base.__name__,)).get(base.__name__, [])
    return rows


def config_markdown() -> str:
    """docs/CONFIG.md: every field with its type, default and meaning."""
    simulators = {sim.settings.__name__: f"env.{name}" for name, sim in SIMULATORS.items()}
    families = {r.settings.__name__: f"model.{name}" for name, r in FAMILIES.items() if r.settings is not None}
    sections = {"Config": "top level", "ModelConfig": "model", "LoraConfig": "model.lora", **families,
                "EnvConfig": "env",
                "DisaggSimConfig": "parallel.disagg_sim", **simulators,
                "AlgoConfig": "algo", "ParallelConfig": "parallel", "DeepSpeedConfig": "deepspeed",
                "RolloutConfig": "rollout", "SyncConfig": "sync", "SftConfig": "sft",
                "RecordConfig": "record", "DemoConfig": "demo"}
    presets, defaults = preset_configs(), default_options()
    picked = ", ".join(f"`{group}={option}`" for group, option in defaults.items())
    lines = ["# Configuration", "", "Generated from `src/vla_scale/config/schema.py`, each simulator's settings "
             "class and the presets under `configs/` by `python -m vla_scale.config.docs`; override any field on the "
             "command line (`algo.lr=3e-4`) or pick a group option (`deepspeed=zero2`).", "",
             f"A run always takes one preset of each group: the default run (`configs/config.yaml`) takes {picked}. "
             "The default column is the schema's; the presets column gives each value a preset sets away from it "
             "(a preset it does not name keeps the schema's default), so the default run's value of a key is the "
             "one its preset is listed with, else the schema's.", ""]
    docs = field_docs()
    for name, record in FAMILIES.items():
        if record.settings is not None:
            cls = record.settings.__name__
            docs[cls] = settings_docs(record.settings)
            docs["ModelConfig"].append((name, cls, f"{cls}()", f"{' '.join(str(record.settings.__doc__).split())} "
                                        f"See the `model.{name}` table."))
    for name, sim in SIMULATORS.items():
        docs.update(field_docs(inspect.getmodule(sim.settings), (sim.settings.__name__,)))
        docs["EnvConfig"].append((name, sim.settings.__name__, f"{sim.settings.__name__}()",
                                  f"{' '.join(str(sim.settings.__doc__).split())} See the `env.{name}` table."))
    for cls, group in sections.items():
        lines += [f"## `{group}` ({cls})", ""]
        prefix = "" if cls == "Config" else f"{group}."
        folder = group.split(".")[0]
        if folder in defaults:
            lines += [f"| key | type | default | presets (`{folder}=...`; the default run: `{defaults[folder]}`) | "
                      "meaning |", "|---|---|---|---|---|"]
            lines += [f"| `{prefix}{name}` | {typ} | `{default}` | {preset_cell(presets[folder], prefix + name)} | "
                      f"{doc} |" for name, typ, default, doc in docs[cls]]
        else:
            lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
            lines += [f"| `{prefix}{name}` | {typ} | `{default}` | {doc} |" for name, typ, default, doc in docs[cls]]
        lines.append("")
        if cls == "AlgoConfig":
            lines += algorithm_table()
    return "\n".join(lines)


def default_options() -> dict[str, str]:
    """{group: the preset `configs/config.yaml` picks}, in its defaults list's order."""
    entries = OmegaConf.to_container(OmegaConf.load(CONFIGS / "config.yaml"))["defaults"]  # type: ignore[index]
    return {group: option for entry in entries if isinstance(entry, dict) for group, option in entry.items()}


@functools.cache
def preset_configs() -> dict[str, dict[str, schema.Config]]:
    """{group: {preset: the schema's Config with what `configs/<group>/<preset>.yaml` sets (through its defaults
    list)}}, for every YAML file under `configs/<group>/`."""
    from hydra import compose, initialize_config_dir

    base = OmegaConf.structured(schema.Config)
    out: dict[str, dict[str, schema.Config]] = {}
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        for group in sorted(p for p in CONFIGS.iterdir() if p.is_dir()):
            out[group.name] = {yaml.stem: schema.to_config(OmegaConf.merge(
                base, compose(config_name=f"{group.name}/{yaml.stem}"))) for yaml in sorted(group.glob("*.yaml"))}
    return out


def preset_cell(presets: dict[str, schema.Config], key: str) -> str:
    """The presets that set `key` away from the schema's default, grouped by value: 'tiny, tiny_libero: `16`;
    oft_7b: `14`' ('' when none does; a nested section's field is documented in its own table)."""
    default = _value(schema.Config(), key)
    by_value: dict[str, list[str]] = {}
    for name, cfg in presets.items():
        value = _value(cfg, key)
        if value != default and not dataclasses.is_dataclass(value):
            by_value.setdefault(repr(value), []).append(name)
    return "; ".join(f"{', '.join(names)}: `{value}`" for value, names in by_value.items())


def _value(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def algorithm_table() -> list[str]:
    """The algorithms `algo.name` names, each with its module's first paragraph (`algo/registry.py`)."""
    from vla_scale.algo.registry import algorithm_class, algorithm_names

    lines = ["### `algo.name`: the algorithms", "", "| name | module | what it is |", "|---|---|---|"]
    for name in algorithm_names():
        module = inspect.getmodule(algorithm_class(name))
        first = " ".join(str(inspect.getdoc(module)).split("\n\n")[0].split())
        lines.append(f"| `{name}` | `algo/{name}.py` | {first} |")
    return [*lines, ""]


if __name__ == "__main__":
    print(config_markdown())
