"""docs/CONFIG.md, generated from the schemas' field docstrings: `python -m vla_scale.config.docs > docs/CONFIG.md`."""

from __future__ import annotations

import ast
import inspect

from vla_scale.config import schema


def field_docs() -> dict[str, list[tuple[str, str, str, str]]]:
    """{schema class: [(field, type, default, docstring)]} read from the field docstrings of `config/schema.py`."""
    tree = ast.parse(inspect.getsource(schema))
    docs: dict[str, list[tuple[str, str, str, str]]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or not node.name.endswith("Config"):
            continue
        rows = docs.setdefault(node.name, [])
        for stmt, nxt in zip(node.body, node.body[1:] + [None], strict=True):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                doc = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) else ""
                default = ast.unparse(stmt.value) if stmt.value is not None else ""
                rows.append((stmt.target.id, ast.unparse(stmt.annotation), default, " ".join(str(doc).split())))
    return docs


def config_markdown() -> str:
    """docs/CONFIG.md: every field with its type, default and meaning."""
    sections = {"Config": "top level", "ModelConfig": "model", "LoraConfig": "model.lora", "EnvConfig": "env",
                "RolloutConfig": "env.rollout",
                "DisaggSimConfig": "env.disagg_sim", "ReachConfig": "env.reach", "LiberoConfig": "env.libero",
                "AlgoConfig": "algo", "ParallelConfig": "parallel", "DeepSpeedConfig": "deepspeed"}
    lines = ["# Configuration", "", "Generated from `src/vla_scale/config/schema.py` by "
             "`python -m vla_scale.config.docs`; override any field on the command line (`algo.lr=3e-4`) or pick a "
             "group option (`deepspeed=zero2`).", ""]
    docs = field_docs()
    for cls, group in sections.items():
        lines += [f"## `{group}` ({cls})", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        prefix = "" if cls == "Config" else f"{group}."
        lines += [f"| `{prefix}{name}` | {typ} | `{default}` | {doc} |" for name, typ, default, doc in docs[cls]]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(config_markdown())
