"""The PaliGemma SentencePiece tokenizer and the two prompts openpi builds with it (π0's, π0.5's).

The task text is cleaned as openpi does (surrounding spaces stripped, underscores and newlines made spaces). π0's
prompt is `[BOS] text` followed by the tokens of "\\n" encoded on their own (the start-of-answer marker); the state
goes to the action expert as a vector. π0.5's prompt carries the state: each dimension of the normalised state
(before it is padded to the model's action size) is put into one of 256 equal bins over [-1, 1] (as numpy's
`digitize` puts values outside: -1 below -1, the last bin, 255, above 1) and written as decimal numbers,
`[BOS] "Task: <text>, State: <b0> <b1> ...;\\nAction: "`. Either is right-padded with id 0 to the prompt budget and
cut to it when longer, with a mask of the real tokens.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import sentencepiece

log = logging.getLogger(__name__)

STATE_BINS = 256
"""Bins of π0.5's discretised state over [-1, 1]."""


def clean_prompt(text: str) -> str:
    return text.strip().replace("_", " ").replace("\n", " ")


def discretize_state(state: np.ndarray) -> np.ndarray:
    """Normalised state [D] -> bin indices int[D] (openpi's `np.digitize` over 256 equal bins of [-1, 1])."""
    edges = np.linspace(-1, 1, STATE_BINS + 1)[:-1]
    return np.digitize(state, bins=edges) - 1


class PaliGemmaTokenizer:
    """A SentencePiece model (PaliGemma's `paligemma_tokenizer.model`, or any other) and a prompt budget."""

    def __init__(self, model_file: str | Path, max_len: int):
        path = Path(model_file)
        try:
            self.processor = sentencepiece.SentencePieceProcessor(model_proto=path.read_bytes())
        except (RuntimeError, OSError) as error:
            raise ValueError(f"{path} is not a readable SentencePiece model: {error}") from None
        self.max_len = max_len
        self.path = path

    @property
    def vocab_size(self) -> int:
        return int(self.processor.vocab_size())

    def prompt_ids(self, text: str, state: np.ndarray | None = None) -> list[int]:
        """The unpadded ids: π0's prompt without `state`, π0.5's with it."""
        text = clean_prompt(text)
        if state is None:
            return self.processor.encode(text, add_bos=True) + self.processor.encode("\n")
        bins = " ".join(str(int(b)) for b in discretize_state(np.asarray(state)))
        return self.processor.encode(f"Task: {text}, State: {bins};\nAction: ", add_bos=True)

    def tokenize(self, text: str, state: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64[max_len], mask bool[max_len]): the prompt padded with 0, or cut to the budget (logged)."""
        ids = self.prompt_ids(text, state)
        if len(ids) > self.max_len:
            log.warning("prompt of %d tokens cut to the budget of %d", len(ids), self.max_len)
            ids = ids[: self.max_len]
        mask = np.zeros(self.max_len, dtype=bool)
        mask[: len(ids)] = True
        tokens = np.zeros(self.max_len, dtype=np.int64)
        tokens[: len(ids)] = ids
        return tokens, mask
