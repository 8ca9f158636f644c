"""Rows to token examples: chat formatting, loss masks, truncation and packing.

Public API:

- ``LMExample(input_ids, labels)``: one language-modelling example (int32 arrays of equal
  length; ``labels`` is ``-100`` where no loss is taken).
- ``ChoiceExample(input_ids, choice_token_ids, answer_index)``: one multiple-choice
  question for letter-restricted argmax accuracy (paper appendix M).
- ``tokenize_rows(rows, tokenizer, source) -> datasets.Dataset``: every row's token ids
  and loss labels through ``Dataset.map``, cached on disk for rows read from files (the
  cache key includes ``TOKENIZATION_VERSION``, a hash of this module's and ``loading``'s code).
- ``build_examples(rows, tokenizer, source, *, sequence_length, packing=False)``: tokenize
  every row once (``tokenize_rows``) into a list of examples (``LMExample`` for ``text``/``instruction``
  sources and ``multiple_choice`` scored by loss, ``ChoiceExample`` for ``multiple_choice``
  scored by accuracy).
- ``letter_token_ids(tokenizer, num_letters)``: the token id of " A", " B", ...
- ``pad_token_id(tokenizer)``: the pad id, or the EOS id when the tokenizer has no pad.
- ``FALLBACK_TEMPLATE``: how instruction rows are rendered without a chat template.

Formats (``DataSource.format``):

- ``text``: ``tokenizer(text)`` (with the tokenizer's own special tokens, e.g. BOS) plus
  EOS; the loss is on every token.
- ``instruction``: a ``messages`` list, or a prompt/response pair turned into
  ``[system?, user, assistant]``. The last message is the response; everything before it
  is the prompt, and its tokens get label ``-100``. With a chat template the row is
  rendered with ``tokenizer.apply_chat_template`` twice, the prompt alone with
  ``add_generation_prompt=True`` and the whole conversation, and both are tokenized without
  extra special tokens (the template writes them). When the prompt's ids are a prefix of
  the whole conversation's ids, the boundary is their length. When they are not (a BPE merge
  across the boundary), but the prompt's *text* is a prefix of the conversation's text, the
  example is the prompt's ids followed by the ids of the rest of the text, so the boundary is
  exact by construction. Otherwise the template rewrites earlier turns and ``DataError`` is
  raised. Without a chat template, ``FALLBACK_TEMPLATE`` renders the prompt and the
  response's tokens are followed by EOS.
- ``multiple_choice`` scored by accuracy (``source.metric == "accuracy"``): the prompt
  ``"{question}\\nA. {choice}\\nB. {choice}\\n...Answer:"`` (with the tokenizer's special
  tokens); a prompt longer than ``sequence_length`` keeps its *last* tokens, so the scoring
  position still follows ``"Answer:"``.
- ``multiple_choice`` scored by loss (``source.metric == "loss"``): an ``LMExample`` whose
  prompt is ``"{question}\\nAnswer:"`` and whose response, the only tokens with a loss, is
  ``" {correct choice}"``: the loss of the correct answer, as the paper constrains its tiny
  benchmarks in scenarios 1-50. The choices are not listed (the loss is of the answer's text,
  not of a letter). It is truncated like an instruction example.

Answers (``answer_column``): a 0-based index, a letter (``"B"``), one of the choices' own
labels (ARC's ``"A"``/``"1"``), a decimal string (HellaSwag's ``"2"``), or a list of 0/1
flags with a single 1 (TruthfulQA's ``mc1_targets.labels``).

Chat lists may use ``{"role", "content"}`` or the ShareGPT keys ``{"from", "value"}`` (roles
``human``/``gpt`` become ``user``/``assistant``); with ``system_column`` set, a non-empty
system prompt of the row is put first.

Fixed length: with ``packing=False`` every example is cut to its first ``sequence_length``
tokens (with ``source.truncation_side == "left"``, to the prompt's leading special tokens,
e.g. BOS, followed by the window that ends with its last token, or starts at its response
when the response alone is longer: the middle of the prompt is cut, so a long document is
best put before its question or instruction), and an instruction example left with no response token (a prompt as long as the
sequence) is dropped (a warning says how many); when every example is dropped the source is
refused with ``DataError``. A multiple-choice prompt that is too long keeps its last tokens
(a warning says how many). With ``packing=True`` the documents (each ending in EOS or the
template's end-of-turn) are concatenated, labels alongside ids, and cut into blocks of
``sequence_length``; the last block may be shorter, and a block without any loss token (all
prompt) is dropped. Packed documents attend to each other, as in the usual causal-LM packing.
With ``packing="per-document"`` they do not: each example also carries ``position_ids``
that restart at every document, and the label of each document's first token is -100, so
a model given the positions without an attention mask (``collate_lm`` does so) computes
every document's losses as it would unpacked (a document cut at a block's end continues
from its position in the next block, seeing only that block's part).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import ascii_uppercase
from typing import Any, Literal

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from dynamics.data import loading
from dynamics.data.loading import DataError, DataSource, check_columns

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
"""Label of a position without loss (the value Hugging Face models ignore)."""

Packing = bool | Literal["per-document"]
"""False: one example per document, truncated. True: documents concatenated and cut into
blocks, attending to each other. ``"per-document"``: blocks in which each document attends
only to itself."""
PACKING_MODES: tuple[Packing, ...] = (False, True, "per-document")

FALLBACK_TEMPLATE = "### {Role}:\n{content}\n\n"
"""Rendering of one message without a chat template; ``Role`` is ``System``, ``User`` or
``Assistant``. The prompt is the rendered earlier messages followed by ``"### Assistant:\\n"``;
the response is the last message's content followed by the EOS token."""
FALLBACK_GENERATION_PROMPT = "### Assistant:\n"

TOKENIZATION_VERSION = hashlib.sha256(
    Path(__file__).read_bytes() + Path(loading.__file__ or "").read_bytes()
).hexdigest()[:16]
"""A hash of the source of this module and of ``loading``: part of the cache key of
``tokenize_rows``. ``datasets`` fingerprints a module-level function by its name only, so
without it a change of the prompt format, masking or truncation code would read the tokens
cached by the old code."""


@dataclass(frozen=True, eq=False)
class LMExample:
    """A language-modelling example; ``labels[t] = -100`` where no loss is taken.

    Labels are *not* shifted: the model predicts ``labels[t + 1]`` from position ``t``.
    """

    input_ids: np.ndarray  # int32, shape (T,)
    labels: np.ndarray  # int32, shape (T,)
    position_ids: np.ndarray | None = None
    """Per-document positions of a ``packing="per-document"`` block (None otherwise)."""

    def __post_init__(self) -> None:
        if self.input_ids.shape != self.labels.shape or self.input_ids.ndim != 1:
            raise ValueError(
                f"input_ids {self.input_ids.shape} and labels {self.labels.shape} must be equal 1-d"
            )
        if self.position_ids is not None and self.position_ids.shape != self.input_ids.shape:
            raise ValueError(f"position_ids {self.position_ids.shape} must match input_ids {self.input_ids.shape}")

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True, eq=False)
class ChoiceExample:
    """A multiple-choice question: the prediction is the argmax of the next-token logits
    after the last prompt token, restricted to ``choice_token_ids`` (one letter per choice)."""

    input_ids: np.ndarray  # int32, shape (T,)
    choice_token_ids: np.ndarray  # int32, shape (K,)
    answer_index: int

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


Example = LMExample | ChoiceExample


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The tokenizer's pad id, or its EOS id when it has no pad token (padding is masked)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise DataError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token")
    return int(pad)


def _eos_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
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


# ---------------------------------------------------------------------------------------
# Rows -> conversations
# ---------------------------------------------------------------------------------------


def _string(value: Any, column: str, index: int, source: DataSource) -> str:
    if not isinstance(value, str):
        raise DataError(
            f"{source.description}, row {index}: column {column!r} must hold a string, got "
            f"{type(value).__name__}"
        )
    return value


def _conversation(
    row: Mapping[str, Any], index: int, source: DataSource, use_messages: bool
) -> list[dict[str, str]]:
    """The row as a chat list whose last message is the assistant's response."""
    if use_messages:
        messages = row[source.messages_column]
        if not isinstance(messages, list) or not messages:
            raise DataError(
                f"{source.description}, row {index}: {source.messages_column!r} must be a "
                "non-empty list of {'role', 'content'} messages"
            )
        conversation = []
        for message in messages:
            keys = _message_keys(message)
            if keys is None:
                raise DataError(
                    f"{source.description}, row {index}: every message needs 'role' and "
                    f"'content' keys (or ShareGPT's 'from' and 'value'), got {message!r}"
                )
            role = _string(message[keys[0]], keys[0], index, source)
            conversation.append(
                {
                    "role": SHAREGPT_ROLES.get(role, role),
                    "content": _string(message[keys[1]], source.messages_column, index, source),
                }
            )
        if source.system_column is not None and row[source.system_column] and conversation[0]["role"] != "system":
            system = _string(row[source.system_column], source.system_column, index, source)
            conversation.insert(0, {"role": "system", "content": system})
        if conversation[-1]["role"] != "assistant":
            raise DataError(
                f"{source.description}, row {index}: the last message is the response and must "
                f"have role 'assistant', not {conversation[-1]['role']!r}"
            )
        return conversation
    conversation = []
    if source.system_column is not None and row[source.system_column]:
        system = _string(row[source.system_column], source.system_column, index, source)
        conversation.append({"role": "system", "content": system})
    conversation.append(
        {
            "role": "user",
            "content": _string(row[source.prompt_column], source.prompt_column, index, source),
        }
    )
    conversation.append(
        {
            "role": "assistant",
            "content": _string(row[source.response_column], source.response_column, index, source),
        }
    )
    return conversation


SHAREGPT_ROLES = {"human": "user", "gpt": "assistant"}
"""ShareGPT speaker names (``from``) -> chat roles; ``system`` stays ``system``."""


def _message_keys(message: Any) -> tuple[str, str] | None:
    """The (role, content) keys of one chat message, or None when it has neither pair."""
    if not isinstance(message, Mapping):
        return None
    for keys in (("role", "content"), ("from", "value")):
        if keys[0] in message and keys[1] in message:
            return keys
    return None


def _render_fallback(messages: Iterable[Mapping[str, str]]) -> str:
    text = "".join(
        FALLBACK_TEMPLATE.format(Role=m["role"].capitalize(), content=m["content"])
        for m in messages
    )
    return text + FALLBACK_GENERATION_PROMPT


def _encode(tokenizer: PreTrainedTokenizerBase, texts: list[str], special: bool) -> list[list[int]]:
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=special)["input_ids"]]


def _instruction_documents(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource, start: int
) -> list[LMExample]:
    use_messages = bool(rows) and source.messages_column in rows[0]
    conversations = [_conversation(row, start + i, source, use_messages) for i, row in enumerate(rows)]
    if tokenizer.chat_template is None:
        prompts = [_render_fallback(c[:-1]) for c in conversations]
        prompt_ids = _encode(tokenizer, prompts, special=True)
        response_ids = _encode(tokenizer, [c[-1]["content"] for c in conversations], special=False)
        eos = _eos_token_id(tokenizer)
        return [_masked(p, [*r, eos]) for p, r in zip(prompt_ids, response_ids, strict=True)]

    prompts = [_apply_template(tokenizer, c[:-1], generation_prompt=True) for c in conversations]
    fulls = [_apply_template(tokenizer, c, generation_prompt=False) for c in conversations]
    prompt_ids = _encode(tokenizer, prompts, special=False)
    full_ids = _encode(tokenizer, fulls, special=False)
    documents = []
    for index, (prompt, full, p_ids, f_ids) in enumerate(
        zip(prompts, fulls, prompt_ids, full_ids, strict=True)
    ):
        if f_ids[: len(p_ids)] == p_ids:
            documents.append(_masked(p_ids, f_ids[len(p_ids) :]))
        elif full.startswith(prompt):
            # The tokenizer merged tokens across the boundary: tokenize the two texts apart.
            rest = _encode(tokenizer, [full[len(prompt) :]], special=False)[0]
            documents.append(_masked(p_ids, rest))
        else:
            raise DataError(
                f"{source.description}, row {start + index}: the chat template's rendering of the "
                "prompt with add_generation_prompt=True is not a prefix of its rendering of the "
                "whole conversation, so the response tokens cannot be located; use a template "
                "that renders earlier turns the same way, or set tokenizer.chat_template = None "
                "to use the fallback template"
            )
    return documents


def _apply_template(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], generation_prompt: bool
) -> str:
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )
    if not isinstance(text, str):
        raise DataError(f"apply_chat_template returned {type(text).__name__}, expected a string")
    return text


def _masked(prompt_ids: Sequence[int], response_ids: Sequence[int]) -> LMExample:
    ids = np.asarray([*prompt_ids, *response_ids], dtype=np.int32)
    labels = ids.copy()
    labels[: len(prompt_ids)] = IGNORE_INDEX
    return LMExample(input_ids=ids, labels=labels)


def _text_documents(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource, start: int
) -> list[LMExample]:
    texts = [_string(row[source.text_column], source.text_column, start + i, source) for i, row in enumerate(rows)]
    nonempty = [t for t in texts if t.strip()]
    if len(nonempty) < len(texts):
        logger.warning(
            "%s: skipped %d empty documents", source.description, len(texts) - len(nonempty)
        )
    eos = _eos_token_id(tokenizer)
    documents = []
    for ids in _encode(tokenizer, nonempty, special=True):
        if not ids or ids[-1] != eos:
            ids.append(eos)
        array = np.asarray(ids, dtype=np.int32)
        documents.append(LMExample(input_ids=array, labels=array.copy()))
    return documents


# ---------------------------------------------------------------------------------------
# Documents -> fixed-length examples
# ---------------------------------------------------------------------------------------


def _truncate(
    documents: list[LMExample], sequence_length: int, source: DataSource, special_ids: frozenset[int] = frozenset()
) -> list[LMExample]:
    examples = []
    for doc in documents:
        # Left truncation keeps the prompt's leading special tokens (BOS, a template's
        # start-of-turn) and cuts what follows them; a response longer than the rest of the
        # sequence keeps its first tokens.
        head, start = 0, 0
        if source.truncation_side == "left" and len(doc) > sequence_length:
            response_start = int(np.argmax(doc.labels != IGNORE_INDEX))
            while head < min(response_start, sequence_length - 1) and int(doc.input_ids[head]) in special_ids:
                head += 1
            start = max(head, min(response_start, len(doc) - (sequence_length - head)))
        window = np.r_[0:head, start : min(len(doc), start + sequence_length - head)]
        labels = doc.labels[window]
        if not (labels != IGNORE_INDEX).any():
            continue
        # Copies (fancy indexing), so that the long documents' arrays are freed.
        examples.append(LMExample(input_ids=doc.input_ids[window], labels=labels))
    dropped = len(documents) - len(examples)
    if dropped and examples:  # with none left, build_examples refuses the source instead
        logger.warning(
            "%s: dropped %d of %d examples whose response starts after %d tokens",
            source.description,
            dropped,
            len(documents),
            sequence_length,
        )
    return examples


def _pack(documents: list[LMExample], sequence_length: int, per_document: bool) -> list[LMExample]:
    if not documents:
        return []
    ids = np.concatenate([d.input_ids for d in documents])
    labels = np.concatenate([d.labels for d in documents])
    positions = None
    if per_document:
        # Unpacked, a document's first token is never predicted; packed, it would be
        # predicted from the previous document's last token.
        starts = np.cumsum([0, *(len(d) for d in documents[:-1])])
        labels[starts] = IGNORE_INDEX
        positions = np.concatenate([np.arange(len(d), dtype=np.int32) for d in documents])
    return [
        LMExample(
            input_ids=ids[start : start + sequence_length],
            labels=labels[start : start + sequence_length],
            position_ids=None if positions is None else positions[start : start + sequence_length],
        )
        for start in range(0, len(ids), sequence_length)
        if (labels[start : start + sequence_length] != IGNORE_INDEX).any()
    ]


def _choice_loss_documents(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource, start: int
) -> list[LMExample]:
    """Each question as prompt ``"{question}\\nAnswer:"`` and response ``" {correct choice}"``."""
    prompts: list[str] = []
    answers: list[str] = []
    for index, row in enumerate(rows, start):
        question = _string(row[source.question_column], source.question_column, index, source)
        choices, labels = _choices(row[source.choices_column], index, source)
        correct = _answer_index(row[source.answer_column], labels, len(choices), index, source)
        prompts.append(f"{question}\nAnswer:")
        answers.append(" " + choices[correct])
    prompt_ids = _encode(tokenizer, prompts, special=True)
    answer_ids = _encode(tokenizer, answers, special=False)
    return [_masked(p, a) for p, a in zip(prompt_ids, answer_ids, strict=True)]


def _choice_questions(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource, start: int
) -> dict[str, list[Any]]:
    """The whole prompt's ids, the letters' token ids and the answer of each question."""
    prompts: list[str] = []
    choice_counts: list[int] = []
    answers: list[int] = []
    for index, row in enumerate(rows, start):
        question = _string(row[source.question_column], source.question_column, index, source)
        choices, labels = _choices(row[source.choices_column], index, source)
        answers.append(
            _answer_index(row[source.answer_column], labels, len(choices), index, source)
        )
        lines = [
            question,
            *(f"{ascii_uppercase[k]}. {c}" for k, c in enumerate(choices)),
            "Answer:",
        ]
        prompts.append("\n".join(lines))
        choice_counts.append(len(choices))
    letters = letter_token_ids(tokenizer, max(choice_counts)) if choice_counts else []
    return {
        "input_ids": _encode(tokenizer, prompts, special=True),
        "choice_token_ids": [letters[:count] for count in choice_counts],
        "answer_index": answers,
    }


def _choice_examples(encoded: datasets.Dataset, source: DataSource, sequence_length: int) -> list[ChoiceExample]:
    """Tokenized questions as examples; a prompt longer than ``sequence_length`` keeps its end."""
    prompts = encoded["input_ids"]
    cut = sum(len(ids) > sequence_length for ids in prompts)
    if cut:
        logger.warning(
            "%s: kept the last %d tokens of %d questions longer than that",
            source.description,
            sequence_length,
            cut,
        )
    return [
        ChoiceExample(
            input_ids=np.asarray(ids[-sequence_length:], dtype=np.int32),
            choice_token_ids=np.asarray(letters, dtype=np.int32),
            answer_index=int(answer),
        )
        for ids, letters, answer in zip(prompts, encoded["choice_token_ids"], encoded["answer_index"], strict=True)
    ]


def _choices(value: Any, index: int, source: DataSource) -> tuple[list[str], list[str]]:
    """Choice texts and their dataset labels (ARC-style dicts carry labels, lists do not)."""
    column = source.choices_column
    if isinstance(value, Mapping) and "text" in value:
        texts, labels = list(value["text"]), [str(v) for v in value.get("label") or []]
    elif isinstance(value, list):
        texts, labels = value, []
    else:
        raise DataError(
            f"{source.description}, row {index}: {column!r} must be a list of choices or a "
            f"{{'text': [...], 'label': [...]}} dict, got {type(value).__name__}"
        )
    if not 2 <= len(texts) <= len(ascii_uppercase):
        raise DataError(f"{source.description}, row {index}: {len(texts)} choices; need 2 to 26")
    return [_string(t, column, index, source) for t in texts], labels


def _answer_index(
    value: Any, labels: list[str], num_choices: int, index: int, source: DataSource
) -> int:
    """The 0-based correct choice: a dataset label (ARC's "A" or "1"), a letter, or an index."""
    if isinstance(value, str) and value in labels:
        return labels.index(value)
    if isinstance(value, str) and len(value) == 1 and value.upper() in ascii_uppercase:
        answer = ascii_uppercase.index(value.upper())
    elif isinstance(value, str) and value.strip().isdecimal():
        answer = int(value)
    elif isinstance(value, int | np.integer) and not isinstance(value, bool):
        answer = int(value)
    elif isinstance(value, list) and sorted(value) == [0] * (len(value) - 1) + [1]:
        if len(value) != num_choices:
            raise DataError(
                f"{source.description}, row {index}: {len(value)} answer flags in "
                f"{source.answer_column!r} for {num_choices} choices; give one flag per choice"
            )
        answer = value.index(1)
    else:
        raise DataError(
            f"{source.description}, row {index}: answer {value!r} in {source.answer_column!r} "
            "is neither a 0-based index, a letter, one of the choice labels, nor a list of 0/1 "
            "flags with a single 1"
        )
    if not 0 <= answer < num_choices:
        raise DataError(
            f"{source.description}, row {index}: answer {value!r} in {source.answer_column!r} "
            f"is outside the {num_choices} choices"
        )
    return answer


_LM_FEATURES = datasets.Features(
    {"input_ids": datasets.Sequence(datasets.Value("int32")), "labels": datasets.Sequence(datasets.Value("int32"))}
)
_CHOICE_FEATURES = datasets.Features(
    {
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "choice_token_ids": datasets.Sequence(datasets.Value("int32")),
        "answer_index": datasets.Value("int32"),
    }
)


def _encode_batch(
    batch: dict[str, list[Any]],
    indices: list[int],
    tokenizer: PreTrainedTokenizerBase,
    source: DataSource,
    version: str,
) -> dict[str, list[Any]]:
    """``Dataset.map`` function: one batch of rows to token ids (see ``tokenize_rows``;
    ``version``, ``TOKENIZATION_VERSION``, only keys the cache)."""
    rows = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
    start = indices[0] if indices else 0
    if source.format == "multiple_choice" and source.metric == "accuracy":
        return _choice_questions(rows, tokenizer, source, start)
    if source.format == "multiple_choice":
        documents = _choice_loss_documents(rows, tokenizer, source, start)
    elif source.format == "text":
        documents = _text_documents(rows, tokenizer, source, start)
    else:
        documents = _instruction_documents(rows, tokenizer, source, start)
    return {"input_ids": [d.input_ids for d in documents], "labels": [d.labels for d in documents]}


def tokenize_rows(
    rows: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, source: DataSource
) -> datasets.Dataset:
    """Every row's token ids, through ``Dataset.map`` (batched): ``input_ids`` and ``labels``
    (whole documents, before truncation or packing), or for a question scored by accuracy
    ``input_ids`` (the whole prompt), ``choice_token_ids`` and ``answer_index``.

    Rows read from files are mapped into ``datasets``' cache next to their Arrow files, keyed
    by the rows, the tokenizer, the source's settings and ``TOKENIZATION_VERSION`` (the code
    of this module and of ``loading``): a second run on the same machine, or
    a second process once the first has finished (``Accelerator.local_main_process_first``),
    reads the tokens instead of tokenizing again. Rows in memory are tokenized in memory.
    """
    choice = source.format == "multiple_choice" and source.metric == "accuracy"
    return rows.map(
        _encode_batch,
        batched=True,
        with_indices=True,
        # The in-memory rows of a source are not part of what is tokenized (the rows are), but
        # its description ("rows in memory") stays in the error messages.
        fn_kwargs={
            "tokenizer": tokenizer,
            "source": dataclasses.replace(source, rows=None, origin="rows in memory" if source.rows is not None else source.origin),
            "version": TOKENIZATION_VERSION,
        },
        remove_columns=rows.column_names,
        features=_CHOICE_FEATURES if choice else _LM_FEATURES,
        desc=f"tokenizing {source.name or 'rows'}",
    )


def build_examples(
    rows: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    source: DataSource,
    *,
    sequence_length: int,
    packing: Packing = False,
) -> list[LMExample] | list[ChoiceExample]:
    """Tokenize every row of ``rows`` once (see the module docstring for the formats).

    ``sequence_length`` is the most tokens of one example. ``packing`` (False, True or
    ``"per-document"``) applies to ``text`` and ``instruction`` sources; a
    ``multiple_choice`` source is always one example per question, so one packing setting
    can serve every source of a run.
    """
    if packing not in PACKING_MODES:
        raise DataError(f"packing={packing!r}: use false, true or 'per-document'")
    if sequence_length < 1:
        raise DataError(f"sequence_length={sequence_length}: must be >= 1")
    check_columns(rows, source)
    encoded = tokenize_rows(rows, tokenizer, source)
    if source.format == "multiple_choice" and source.metric == "accuracy":
        return _choice_examples(encoded, source, sequence_length)
    documents = [
        LMExample(input_ids=np.asarray(ids, dtype=np.int32), labels=np.asarray(labels, dtype=np.int32))
        for ids, labels in zip(encoded["input_ids"], encoded["labels"], strict=True)
    ]
    # A question scored by loss stays one example, as one scored by accuracy does.
    pack = packing and source.format != "multiple_choice"
    examples = (
        _pack(documents, sequence_length, per_document=packing == "per-document")
        if pack
        else _truncate(documents, sequence_length, source, frozenset(tokenizer.all_special_ids))
    )
    if documents and not examples:
        raise DataError(
            f"{source.description}: no example keeps a response token within "
            f"sequence_length={sequence_length}: every prompt fills the sequence; raise "
            "sequence_length (training.sequence_length in a run config)"
        )
    return examples
