"""docs/CONFIG.md, generated from the schemas' field docstrings: `python -m vla_scale.config.docs > docs/CONFIG.md`."""

from __future__ import annotations

import ast
import inspect
from types import ModuleType

from vla_scale.config import schema
from vla_scale.envs.registry import SIMULATORS


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


def config_markdown() -> str:
    """docs/CONFIG.md: every field with its type, default and meaning."""
    simulators = {sim.settings.__name__: f"env.{name}" for name, sim in SIMULATORS.items()}
    sections = {"Config": "top level", "ModelConfig": "model", "LoraConfig": "model.lora",
                "Pi0ModelConfig": "model.pi0", "EnvConfig": "env",
                "DisaggSimConfig": "parallel.disagg_sim", **simulators,
                "AlgoConfig": "algo", "ParallelConfig": "parallel", "DeepSpeedConfig": "deepspeed",
                "RolloutConfig": "rollout", "SyncConfig": "sync", "SftConfig": "sft",
                "RecordConfig": "record", "DemoConfig": "demo"}
    lines = ["# Configuration", "", "Generated from `src/vla_scale/config/schema.py` and each simulator's settings "
             "class by `python -m vla_scale.config.docs`; override any field on the command line (`algo.lr=3e-4`) "
             "or pick a group option (`deepspeed=zero2`).", ""]
    docs = field_docs()
    for name, sim in SIMULATORS.items():
        docs.update(field_docs(inspect.getmodule(sim.settings), (sim.settings.__name__,)))
        docs["EnvConfig"].append((name, sim.settings.__name__, f"{sim.settings.__name__}()",
                                  f"{' '.join(str(sim.settings.__doc__).split())} See the `env.{name}` table."))
    for cls, group in sections.items():
        lines += [f"## `{group}` ({cls})", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        prefix = "" if cls == "Config" else f"{group}."
        lines += [f"| `{prefix}{name}` | {typ} | `{default}` | {doc} |" for name, typ, default, doc in docs[cls]]
        lines.append("")
        if cls == "AlgoConfig":
            lines += algorithm_table()
    return "\n".join(lines)


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
