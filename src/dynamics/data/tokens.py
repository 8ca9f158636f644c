"""Token ids every row format needs: the pad, EOS and answer-letter ids of a tokenizer, a
batch of texts encoded, a prompt/response pair as an example whose loss is on the response,
and where a completion starts after its prompt."""

from __future__ import annotations

from collections.abc import Sequence
from string import ascii_uppercase
from typing import TYPE_CHECKING

import numpy as np

from dynamics.data.errors import DataError
from dynamics.data.examples import IGNORE_INDEX, LMExample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The tokenizer's pad id, or its EOS id when it has no pad token (padding is masked)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise DataError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token")
    return int(pad)


def eos_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The EOS id that ends every document; ``DataError`` when the tokenizer has none."""
    if tokenizer.eos_token_id is None:
        raise DataError(
            "the tokenizer has no EOS token, needed to end documents; set tokenizer.eos_token"
        )
    return int(tokenizer.eos_token_id)


def letter_token_ids(tokenizer: PreTrainedTokenizerBase, num_letters: int) -> list[int]:
    """Token ids of the answer letters " A", " B", ... as the model writes them after "Answer:".

    Each letter is tokenized with its leading space and the *last* token is taken (a
    SentencePiece tokenizer may emit a separate space token first). That token must decode
    to exactly the letter (so the letters are distinct tokens); otherwise accuracy cannot be
    read from one next-token distribution and ``DataError`` is raised.
    """
    if not 1 <= num_letters <= len(ascii_uppercase):
        raise DataError(f"{num_letters} choices: between 1 and 26 are supported")
    ids = []
    for letter in ascii_uppercase[:num_letters]:
        encoded = tokenizer(" " + letter, add_special_tokens=False)["input_ids"]
        token = int(encoded[-1]) if encoded else -1
        decoded = str(tokenizer.decode([token])).strip() if encoded else ""
        if decoded != letter:
            raise DataError(
                f"answer letter {letter!r} is not a single token of this tokenizer (' {letter}' "
                f"ends in token {token} = {decoded!r}); letter-restricted accuracy needs one "
                "token per letter: use a loss metric for this domain or another tokenizer"
            )
        ids.append(token)
    return ids


def encode_texts(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], special: bool
) -> list[list[int]]:
    """The token ids of each text, with the tokenizer's special tokens (BOS) when ``special``."""
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=special)["input_ids"]]


def masked_example(prompt_ids: Sequence[int], response_ids: Sequence[int]) -> LMExample:
    """The prompt followed by the response, the loss on the response's tokens only."""
    ids = np.asarray([*prompt_ids, *response_ids], dtype=np.int32)
    labels = ids.copy()
    labels[: len(prompt_ids)] = IGNORE_INDEX
    return LMExample(input_ids=ids, labels=labels)


def common_prefix_length(ids: list[int], other_ids: list[int]) -> int:
    """How many leading tokens the two share (TRL's ``common_prefix_length``): where a
    completion starts in the ids of its prompt followed by it."""
    differences = (i for i, (a, b) in enumerate(zip(ids, other_ids, strict=False)) if a != b)
    return next(differences, min(len(ids), len(other_ids)))
