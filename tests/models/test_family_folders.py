"""A policy family is its folder (`models/oft/`, `models/pi0/`): the rollout engine, the actor, the batches, the env
loop and the trainer reach it through `PolicySource` (its decoder and its scorer) and hold no default that stands for
one family."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from vla_scale.batches import logprob_mask
from vla_scale.config import ModelConfig

SRC = Path(__file__).resolve().parents[2] / "src" / "vla_scale"
SHARED = ["rollout/engine.py", "rollout/env_loop.py", "rollout/stack.py", "parallel/actor/zero3.py", "batches.py",
          "trainer.py", "run_setup.py", "algo/base.py", "algo/ppo.py"]
FAMILY_NAMES = {"OFTPolicy", "PretrainedVLA", "Pi0Policy", "Pi0Source", "OFTDecoder", "OFTScorer", "FlowDecoder",
                "FlowScorer", "FlowPolicy", "FlowSource"}


def _family_references(path: Path) -> list[str]:
    """Names of one family's classes, and `decoder` / `scorer` compared with None, in `path`'s code."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        named = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if named in FAMILY_NAMES:
            found.append(f"{path.name}:{node.lineno}: {named}")
        if isinstance(node, ast.ImportFrom):
            found += [f"{path.name}:{node.lineno}: import {a.name}" for a in node.names if a.name in FAMILY_NAMES]
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
            left = ast.unparse(node.left)
            if left.endswith(("decoder", "scorer")) and ast.unparse(node.comparators[0]) == "None":
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("module", SHARED)
def test_shared_code_names_no_family(module: str) -> None:
    assert _family_references(SRC / module) == []


def test_each_family_hands_out_its_decoder_and_scorer() -> None:
    from vla_scale.models.flow.rollout import FlowDecoder, FlowScorer
    from vla_scale.models.oft.decode import OFTDecoder, OFTScorer

    for decoder in (OFTDecoder, FlowDecoder):
        assert callable(decoder.decode) and callable(decoder.fast_forward)
    for scorer in (OFTScorer, FlowScorer):
        assert callable(scorer.logprobs)
    assert (SRC / "models" / "oft" / "policy.py").exists() and not (SRC / "models" / "policy.py").exists()
    assert (SRC / "models" / "oft" / "fast_forward.py").exists() and not (SRC / "rollout" / "fast_forward.py").exists()


def test_a_log_prob_counts_when_the_first_action_it_covers_ran() -> None:
    """One rule for every width of record: per action token (OFT), per action, per chunk (π0)."""
    model = ModelConfig(chunk_len=4, action_dim=2)
    executed = torch.tensor([0, 1, 4])
    per_token = logprob_mask(executed, 8, model)
    assert per_token.tolist() == [[False] * 8, [True] * 2 + [False] * 6, [True] * 8]
    assert logprob_mask(executed, 4, model).tolist() == [[False] * 4, [True, False, False, False], [True] * 4]
    assert logprob_mask(executed, 1, model).tolist() == [[False], [True], [True]]
    with pytest.raises(ValueError, match="does not divide"):
        logprob_mask(executed, 3, model)


@pytest.mark.parametrize("family", ["oft", "pi0", "smolvla"])
def test_every_family_is_registered_with_its_folder_and_a_model_config(family: str) -> None:
    from vla_scale.models.interface import POLICY_FAMILIES
    from vla_scale.models.registry import FAMILIES

    assert set(POLICY_FAMILIES) == set(FAMILIES) == {"oft", "pi0", "smolvla"}
    record = FAMILIES[family]
    assert callable(record.source_for_env()) and callable(record.resolved_model_config())
    from vla_scale.models.oft.pretrained import PretrainedVLA
    from vla_scale.models.pi0.source import Pi0Source
    from vla_scale.models.smolvla.source import SmolVLASource

    source = {"oft": PretrainedVLA, "pi0": Pi0Source, "smolvla": SmolVLASource}[family]
    for member in (source.chunk_decoder, source.chunk_scorer):  # the family's own, or the flow families' shared
        assert any(f"from vla_scale.models.{folder}." in inspect.getsource(member) for folder in (family, "flow")), \
            member
    configs = SRC.parents[1] / "configs" / "model"
    assert any(f"family: {family}" in p.read_text() or (family == "oft" and "family:" not in p.read_text())
               for p in configs.glob("*.yaml"))
    page = (SRC.parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    section = page.split("### Adding a family", 1)[1].split("\n### ", 1)[0]
    assert f"`models/{family}/`" in section


def test_the_third_family_is_its_folder_and_one_registry_entry() -> None:
    """SmolVLA came in as `models/smolvla/` and its line in `models/registry.py`: no other module of the package
    names it (the schema, the checks, the docs, `run_policy` and `checkpoint_family` read the registry's records)."""
    named = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if "smolvla" in p.read_text().lower()
             and p.parent.name != "smolvla" and p.name != "registry.py"]
    assert named == []
    top = {p.stem for p in (SRC / "models").glob("*.py")}
    shared = {"__init__", "checkpoint_folders", "critic", "families", "family", "fp8", "fp8_update", "hub", "interface",
              "kernels", "lerobot_folders", "liger", "lora", "registry", "tokenizer"}
    assert top == shared, "a family's module at the top of models/"
