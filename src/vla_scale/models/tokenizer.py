"""Text and action tokenizers.

`TextTokenizer` is the interface the policy needs from a tokenizer; `WordTokenizer` fills it offline with a
word-level vocabulary built from the task instructions (no download), and a Llama tokenizer can fill it later.
`ActionTokenizer` maps continuous actions in [-1, 1] to `n_bins` uniform bins and back to bin centres; the bins are
the last `n_bins` entries of the padded vocabulary, as in OpenVLA.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
"""OpenVLA's prompt around the instruction."""

SPECIALS = ("<pad>", "<unk>", "<s>")


class TextTokenizer(Protocol):
    """What the policy asks of a text tokenizer."""

    pad_id: int
    bos_id: int
    vocab_size: int

    def encode(self, texts: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded token ids int64[B, max_len] and attention mask bool[B, max_len] (BOS first)."""
        ...


class WordTokenizer:
    """Word-level tokenizer over a fixed vocabulary (lower-cased words and punctuation)."""

    def __init__(self, words: list[str]):
        vocab = {w: i for i, w in enumerate(list(SPECIALS) + sorted(set(words) - set(SPECIALS)))}
        self._tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        self._tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()]
        )
        self.pad_id, self.unk_id, self.bos_id = (vocab[s] for s in SPECIALS)
        self.vocab_size = len(vocab)

    @classmethod
    def from_instructions(cls, instructions: list[str]) -> WordTokenizer:
        """Vocabulary = every word of the prompt template and of the instructions."""
        pre = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
        words: set[str] = set()
        for text in [PROMPT.format(instruction="")] + instructions:
            words.update(w for w, _ in pre.pre_tokenize_str(text.lower()))
        return cls(sorted(words))

    def encode(self, texts: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        ids = np.full((len(texts), max_len), self.pad_id, dtype=np.int64)
        for row, text in enumerate(texts):
            toks = [self.bos_id] + self._tok.encode(text.lower()).ids
            if len(toks) > max_len:
                raise ValueError(f"prompt has {len(toks)} tokens > model.max_text_len={max_len}: raise it ({text!r})")
            ids[row, : len(toks)] = toks
        return ids, ids != self.pad_id


class ActionTokenizer:
    """Uniform bins over [-1, 1]; bin index j decodes to the centre of bin j."""

    def __init__(self, n_bins: int):
        self.n_bins = n_bins
        self.edges = np.linspace(-1.0, 1.0, n_bins + 1)
        self.centres = ((self.edges[:-1] + self.edges[1:]) / 2).astype(np.float32)

    def to_bins(self, actions: np.ndarray) -> np.ndarray:
        """Actions in [-1, 1] (clipped) -> bin indices int64."""
        clipped = np.clip(actions, -1.0, 1.0)
        return np.clip(np.digitize(clipped, self.edges[1:-1]), 0, self.n_bins - 1).astype(np.int64)

    def to_actions(self, bins: np.ndarray) -> np.ndarray:
        """Bin indices -> normalised actions (bin centres)."""
        return self.centres[np.asarray(bins)]
