"""SmolVLA's prompt as LeRobot's pre-processor makes it: the task with a newline appended (its
`smolvla_new_line_processor`), through the VLM's tokenizer (SmolVLM2's byte-level BPE, read from tokenizer.json with
`tokenizers`, no special tokens added beyond what the file's own template adds), right-padded with the pad token,
cut from the left when longer than the budget (SmolVLM2's `truncation_side`).

LeRobot pads a batch to its longest prompt; here every prompt is padded to the budget. The model's outputs are the
same: padded positions are masked keys and add nothing to the position ids (`cumsum(mask) - 1`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

log = logging.getLogger(__name__)
FILES = ("tokenizer.json", "tokenizer_config.json")


class SmolVLATokenizer:
    """The tokenizer files of a folder and a prompt budget."""

    def __init__(self, folder: str | Path, max_len: int):
        path = Path(folder)
        missing = [f for f in FILES if not (path / f).is_file()]
        if missing:
            raise ValueError(f"{path} holds no tokenizer ({', '.join(missing)} missing): point model.smolvla.tokenizer "
                             "at the folder of the VLM's tokenizer (SmolVLM2's tokenizer.json and "
                             "tokenizer_config.json)")
        try:
            self._tok = Tokenizer.from_file(str(path / "tokenizer.json"))
            config = json.loads((path / "tokenizer_config.json").read_text())
        except Exception as error:  # tokenizers raises plain Exceptions for a corrupt file
            raise ValueError(f"{path}: cannot read the tokenizer files ({error}); are they complete?") from None
        self._tok.no_padding()  # LeRobot's saved copies carry its padding and truncation; we apply our own
        self._tok.no_truncation()
        pad = config.get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        self.pad_id = self._tok.token_to_id(pad) if pad else None
        if self.pad_id is None:
            raise ValueError(f"{path}/tokenizer_config.json names no pad token the vocabulary has (SmolVLM2: "
                             "'<|im_end|>')")
        self.path, self.max_len = path, max_len
        self.cut_left = config.get("truncation_side", "left") == "left"

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def prompt_ids(self, text: str, state: np.ndarray | None = None) -> list[int]:
        """The unpadded ids of the task with its newline (SmolVLA puts the state in a token of its own, never in the
        prompt)."""
        del state
        return list(self._tok.encode(text if text.endswith("\n") else f"{text}\n").ids)

    def tokenize(self, text: str, state: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64[max_len], mask bool[max_len]): right-padded with the pad id, cut to the budget (logged)."""
        ids = self.prompt_ids(text, state)
        if len(ids) > self.max_len:
            log.warning("prompt of %d tokens cut to the budget of %d", len(ids), self.max_len)
            ids = ids[-self.max_len:] if self.cut_left else ids[: self.max_len]
        tokens = np.full(self.max_len, self.pad_id, dtype=np.int64)
        tokens[: len(ids)] = ids
        mask = np.zeros(self.max_len, dtype=bool)
        mask[: len(ids)] = True
        return tokens, mask
