"""Checkpoints by hub id: `model.checkpoint=<org>/<name>[@revision]` becomes a local folder through huggingface_hub.

Only the files a checkpoint loader reads are fetched (`LOADED_FILES`), with huggingface_hub's progress bars, into its
usual cache (`HF_HUB_CACHE`); a later run, or one with `HF_HUB_OFFLINE=1`, finds them there without the network.
Anything that stops the resolution (offline and not cached, the hub unreachable, no such repository or revision) is
one error naming the id, `HF_HUB_OFFLINE` and how to pass a local folder instead, raised before anything starts.
"""

from __future__ import annotations

import os
import re

LOADED_FILES = ["config.json", "*.safetensors", "model.safetensors.index.json", "dataset_statistics.json",
                "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "tokenizer.model", "proprio_projector*", "action_head--*", "noisy_action_projector--*",
                "vision_backbone--*", "adapter_config.json"]
"""What `PretrainedVLA.from_pretrained` (and `model.lora.path`) read from a folder: the L1 head of an official
fine-tune decides how it acts, and a diffusion fine-tune's noisy-action projector and a FiLM fine-tune's vision
backbone are what name them to be refused;
nothing else is downloaded (official uploads also hold optimizer states)."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


class HubError(ValueError):
    """A hub id that could not be turned into a local folder (the message says why and what to do)."""


def is_hub_id(reference: str) -> bool:
    """`org/name` or `org/name@revision` that is not a path on this machine."""
    return bool(_HUB_ID.match(reference)) and not os.path.exists(reference)


def resolve_checkpoint(reference: str) -> str:
    """The local folder of `reference`: itself when it is a path, else the hub id's snapshot (downloaded as needed).
    HF_HUB_OFFLINE, HF_HUB_CACHE and HF_ENDPOINT are read when it is called."""
    if not is_hub_id(reference):
        return reference
    repo_id, _, revision = reference.partition("@")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, revision=revision or None, allow_patterns=LOADED_FILES,
                                 local_files_only=offline, cache_dir=os.environ.get("HF_HUB_CACHE") or None,
                                 endpoint=os.environ.get("HF_ENDPOINT") or None)
    except Exception as err:  # offline misses, connection errors, unknown repos and revisions: one message
        why = ("it is not in the hub cache and HF_HUB_OFFLINE is set, so nothing is downloaded" if offline else
               f"the hub did not give it ({type(err).__name__}: {str(err).splitlines()[0][:200]})")
        raise HubError(f"model.checkpoint={reference!r} names a hub checkpoint, but {why}; download it where the hub "
                       "is reachable (unset HF_HUB_OFFLINE), or pass a local folder: "
                       "model.checkpoint=/path/to/checkpoint_folder") from err
