"""Text tokenizers.

`TextTokenizer` is the interface the policy needs from a tokenizer; `WordTokenizer` fills it offline with a
word-level vocabulary built from the task instructions (no download), and a Llama tokenizer can fill it later (it
must then end each prompt with the token OpenVLA expects after "Out:", 29871 for Llama-2). The special tokens take
Llama's ids (unk 0, BOS 1, EOS 2), so a policy sized like OpenVLA reads them where the official one does. The action
bins are in `actions.py`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
"""OpenVLA's prompt around the instruction."""

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")


class TextTokenizer(Protocol):
    """What the policy asks of a text tokenizer."""

    pad_id: int
    bos_id: int
    eos_id: int
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
        self.unk_id, self.bos_id, self.eos_id, self.pad_id = (vocab[s] for s in SPECIALS)
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

