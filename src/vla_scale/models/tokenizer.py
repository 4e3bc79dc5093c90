"""Text tokenizers behind one interface, `TextTokenizer`.

`WordTokenizer` is offline and small: a word-level vocabulary built from the task instructions, for policies trained
from scratch. `HFTokenizer` reads the tokenizer a checkpoint folder holds (tokenizer.json, tokenizer_config.json,
special_tokens_map.json, as a Hugging Face folder lays them out), e.g. OpenVLA's Llama-2 tokenizer with `<PAD>` =
32000. Both give the special tokens Llama's ids where they have them (unk 0, BOS 1, EOS 2), so a policy sized like
OpenVLA reads them where the official one does. The action bins are in `actions.py`.

A prompt's ids are exactly what the official `predict_action` runs on: BOS, the prompt's tokens and, for tokenizers
with a word-boundary token (Llama's "▁", 29871), that token appended as the last id (`predict_action` appends it
when the prompt does not end with it; the policy reads slot 0's logits at that position).
"""

from __future__ import annotations

import json
import os
from typing import Protocol

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
"""OpenVLA's prompt around the instruction (the instruction is lower-cased, as the official code does)."""

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
"""What a checkpoint folder must hold for `HFTokenizer.from_folder`."""


def prompt_text(instruction: str) -> str:
    """The official prompt of an instruction."""
    return PROMPT.format(instruction=instruction.lower())


class TextTokenizer(Protocol):
    """What the policy asks of a text tokenizer."""

    pad_id: int
    bos_id: int
    eos_id: int
    vocab_size: int

    def prompt_ids(self, text: str) -> list[int]:
        """BOS, the tokens of `text`, and the trailing token the model reads slot 0 at (where it has one)."""
        ...

    def encode(self, texts: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded token ids int64[B, max_len] and attention mask bool[B, max_len] (BOS first)."""
        ...

    @property
    def name(self) -> str:
        """What the tokenizer is, the same words before it is saved and after it is read back (`tokenizer_name`)."""
        ...

    def save(self, path: str) -> None:
        """Write the files `HFTokenizer.from_folder` reads back to the same ids."""
        ...


KINDS = {"WordLevel": "word-level", "BPE": "BPE", "Unigram": "Unigram", "WordPiece": "WordPiece"}
"""How the policy line names each `tokenizers` model type."""


def tokenizer_name(tokenizer: Tokenizer) -> str:
    """E.g. 'word-level tokenizer of 40 tokens' (a fresh policy's, saved or not), 'BPE tokenizer of 32001 tokens'
    (Llama-2's with OpenVLA's `<PAD>`): named by its model type and vocabulary, never by the class that holds it."""
    kind = type(tokenizer.model).__name__
    return f"{KINDS.get(kind, kind)} tokenizer of {tokenizer.get_vocab_size(with_added_tokens=True)} tokens"


def pad_rows(rows: list[list[int]], max_len: int, pad_id: int, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad id rows to `max_len`; a row longer than that is an error naming the key to raise."""
    ids = np.full((len(rows), max_len), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), max_len), dtype=bool)
    for row, (toks, text) in enumerate(zip(rows, texts, strict=True)):
        if len(toks) > max_len:
            raise ValueError(f"prompt has {len(toks)} tokens > model.max_text_len={max_len}: raise it, or set it to "
                             f"0 to size it from the suite's prompts ({text!r})")
        ids[row, : len(toks)] = toks
        mask[row, : len(toks)] = True
    return ids, mask


class WordTokenizer:
    """Word-level tokenizer over a fixed vocabulary (lower-cased words and punctuation)."""

    def __init__(self, words: list[str]):
        vocab = {w: i for i, w in enumerate(list(SPECIALS) + sorted(set(words) - set(SPECIALS)))}
        self._tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        self._tok.normalizer = normalizers.Lowercase()
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

    def prompt_ids(self, text: str) -> list[int]:
        return [self.bos_id] + self._tok.encode(text).ids

    def encode(self, texts: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        return pad_rows([self.prompt_ids(t) for t in texts], max_len, self.pad_id, texts)

    @property
    def name(self) -> str:
        return tokenizer_name(self._tok)

    def save(self, path: str) -> None:
        write_tokenizer_files(path, self._tok, dict(zip(("unk_token", "bos_token", "eos_token", "pad_token"),
                                                        SPECIALS, strict=True)))


class HFTokenizer:
    """The tokenizer of a Hugging Face folder, read with `tokenizers` (its own normalizer and template kept).

    transformers 5's `AutoTokenizer` rebuilds a Llama tokenizer's normalizer, which changes the ids of text that
    starts with a space; `tokenizers.Tokenizer.from_file` runs the pipeline the file describes, as the tokenizers
    the official checkpoints were made with do.
    """

    def __init__(self, tokenizer: Tokenizer, pad_token: str, bos_token: str, eos_token: str,
                 word_boundary: str = "▁"):
        self._tok = tokenizer
        tokens = {"pad": pad_token, "bos": bos_token, "eos": eos_token}
        ids = {name: tokenizer.token_to_id(tok) for name, tok in tokens.items()}
        missing = [f"{name} token {tokens[name]!r}" for name, i in ids.items() if i is None]
        if missing:
            raise ValueError(f"the tokenizer's vocabulary lacks its {', '.join(missing)}")
        self.pad_id, self.bos_id, self.eos_id = ids["pad"], ids["bos"], ids["eos"]
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.boundary_id = tokenizer.token_to_id(word_boundary)
        """The id `predict_action` appends after the prompt (Llama: "▁" = 29871); None when there is none."""
        self._adds_bos = tokenizer.encode("").ids[:1] == [self.bos_id]

    @classmethod
    def from_folder(cls, path: str) -> HFTokenizer:
        """Read tokenizer.json and the special tokens (special_tokens_map.json, else tokenizer_config.json)."""
        missing = [f for f in TOKENIZER_FILES if not os.path.isfile(os.path.join(path, f))]
        if missing:
            raise FileNotFoundError(f"{path} has no tokenizer: {', '.join(missing)} missing (an OpenVLA-OFT folder "
                                    "holds the Llama-2 tokenizer files; copy them from the base model's folder)")
        try:
            tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
            specials = {**_read_tokens(os.path.join(path, "tokenizer_config.json")),
                        **_read_tokens(os.path.join(path, "special_tokens_map.json"))}
        except Exception as err:  # tokenizers raises plain Exceptions for a corrupt file
            raise ValueError(f"{path}: cannot read the tokenizer files ({err}); are they complete?") from err
        if "pad_token" not in specials:
            raise ValueError(f"{path}: the tokenizer names no pad token (OpenVLA: '<PAD>' = 32000)")
        return cls(tokenizer, specials["pad_token"], specials.get("bos_token", "<s>"),
                   specials.get("eos_token", "</s>"))

    def prompt_ids(self, text: str) -> list[int]:
        ids = self._tok.encode(text).ids
        if not self._adds_bos:
            ids = [self.bos_id] + ids
        if self.boundary_id is not None and ids[-1] != self.boundary_id:
            ids.append(self.boundary_id)
        return ids

    def encode(self, texts: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        return pad_rows([self.prompt_ids(t) for t in texts], max_len, self.pad_id, texts)

    @property
    def name(self) -> str:
        return tokenizer_name(self._tok)

    def save(self, path: str) -> None:
        names = {key: self._tok.id_to_token(i) for key, i in (("bos_token", self.bos_id), ("eos_token", self.eos_id),
                                                              ("pad_token", self.pad_id))}
        write_tokenizer_files(path, self._tok, names)


def write_tokenizer_files(path: str, tokenizer: Tokenizer, specials: dict[str, str]) -> None:
    """tokenizer.json plus the special tokens, in both files a Hugging Face folder names them in."""
    os.makedirs(path, exist_ok=True)
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        with open(os.path.join(path, name), "w") as f:
            json.dump(specials, f, indent=2)
            f.write("\n")


def _read_tokens(path: str) -> dict[str, str]:
    """The special tokens a tokenizer_config.json / special_tokens_map.json names (strings or AddedToken dicts)."""
    with open(path) as f:
        data = json.load(f)
    out = {}
    for key in ("pad_token", "bos_token", "eos_token"):
        value = data.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out
