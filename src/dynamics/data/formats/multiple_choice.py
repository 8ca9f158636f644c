"""``multiple_choice``: a question, its choices and the correct one per row; evaluated only.

Scored by accuracy (``source.metric == "accuracy"``, the default): the prompt
``"{question}\\nA. {choice}\\nB. {choice}\\n...Answer:"`` (with the tokenizer's special
tokens) and the answer letters' token ids (``ChoiceExample``: letter-restricted argmax
accuracy, paper appendix M); a prompt longer than ``sequence_length`` keeps its *last*
tokens, so the scoring position still follows ``"Answer:"``.

Scored by loss (``source.metric == "loss"``): an ``LMExample`` whose prompt is
``"{question}\\nAnswer:"`` and whose response, the only tokens with a loss, is
``" {correct choice}"``: the loss of the correct answer, as the paper constrains its tiny
benchmarks in scenarios 1-50. The choices are not listed (the loss is of the answer's text,
not of a letter). It is truncated like an instruction example, one example per question.

Answers (``answer_column``): a 0-based index, a letter (``"B"``), one of the choices' own
labels (ARC's ``"A"``/``"1"``), a decimal string (HellaSwag's ``"2"``), or a list of 0/1
flags with a single 1 (TruthfulQA's ``mc1_targets.labels``). With ``source.shuffle_choices``
each question's choices are put in an order seeded by the question and its choices
(``choice_order``), the same on every run, so that a benchmark whose correct choice is always
first (TruthfulQA's mc1) is not answered by always picking "A".
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from string import ascii_uppercase
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np

from dynamics.data.errors import DataError
from dynamics.data.examples import ChoiceExample, LMExample
from dynamics.data.fixed_length import Packing
from dynamics.data.formats.base import RowFormat
from dynamics.data.formats.registry import register
from dynamics.data.rows import row_string
from dynamics.data.tokens import encode_texts, letter_token_ids, masked_example

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dynamics.data.source import DataSource

logger = logging.getLogger(__name__)

CHOICE_FEATURES = datasets.Features(
    {
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "choice_token_ids": datasets.Sequence(datasets.Value("int32")),
        "answer_index": datasets.Value("int32"),
    }
)
"""The tokenized columns of a question scored by accuracy."""


class MultipleChoiceFormat(RowFormat):
    name = "multiple_choice"
    summary = "a question and its choices, scored by accuracy or the answer's loss"
    metrics = ("accuracy", "loss")
    trainable = False
    packs = False

    def required_columns(self, source: DataSource, columns: list[str]) -> list[str]:
        return [source.question_column, source.choices_column, source.answer_column]

    def column_fix(self, source: DataSource) -> str:
        return "set question_column/choices_column/answer_column"

    def documents(
        self,
        rows: list[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        source: DataSource,
        start: int,
        chat_template: str | None,
    ) -> list[LMExample]:
        return _choice_loss_documents(rows, tokenizer, source, start)

    def encode(
        self,
        rows: list[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        source: DataSource,
        start: int,
        chat_template: str | None,
    ) -> dict[str, list[Any]]:
        if source.metric == "accuracy":
            return _choice_questions(rows, tokenizer, source, start)
        return super().encode(rows, tokenizer, source, start, chat_template)

    def features(self, source: DataSource) -> datasets.Features:
        return CHOICE_FEATURES if source.metric == "accuracy" else super().features(source)

    def examples(
        self,
        encoded: datasets.Dataset,
        tokenizer: PreTrainedTokenizerBase,
        source: DataSource,
        sequence_length: int,
        packing: Packing,
    ) -> list[LMExample] | list[ChoiceExample]:
        if source.metric == "accuracy":
            return _choice_examples(encoded, source, sequence_length)
        return super().examples(encoded, tokenizer, source, sequence_length, packing)


def _choice_loss_documents(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource, start: int
) -> list[LMExample]:
    """Each question as prompt ``"{question}\\nAnswer:"`` and response ``" {correct choice}"``."""
    prompts: list[str] = []
    answers: list[str] = []
    for index, row in enumerate(rows, start):
        question, choices, correct = _question(row, index, source)
        prompts.append(f"{question}\nAnswer:")
        answers.append(" " + choices[correct])
    prompt_ids = encode_texts(tokenizer, prompts, special=True)
    answer_ids = encode_texts(tokenizer, answers, special=False)
    return [masked_example(p, a) for p, a in zip(prompt_ids, answer_ids, strict=True)]


def _choice_questions(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource, start: int
) -> dict[str, list[Any]]:
    """The whole prompt's ids, the letters' token ids and the answer of each question."""
    prompts: list[str] = []
    choice_counts: list[int] = []
    answers: list[int] = []
    for index, row in enumerate(rows, start):
        question, choices, correct = _question(row, index, source)
        answers.append(correct)
        lines = [
            question,
            *(f"{ascii_uppercase[k]}. {c}" for k, c in enumerate(choices)),
            "Answer:",
        ]
        prompts.append("\n".join(lines))
        choice_counts.append(len(choices))
    letters = letter_token_ids(tokenizer, max(choice_counts)) if choice_counts else []
    return {
        "input_ids": encode_texts(tokenizer, prompts, special=True),
        "choice_token_ids": [letters[:count] for count in choice_counts],
        "answer_index": answers,
    }


def _choice_examples(
    encoded: datasets.Dataset, source: DataSource, sequence_length: int
) -> list[ChoiceExample]:
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
        for ids, letters, answer in zip(
            prompts, encoded["choice_token_ids"], encoded["answer_index"], strict=True
        )
    ]


def _question(row: Mapping[str, Any], index: int, source: DataSource) -> tuple[str, list[str], int]:
    """A row's question, its choices (shuffled when ``source.shuffle_choices``) and the index
    of the correct one among them."""
    question = row_string(row[source.question_column], source.question_column, index, source)
    choices, labels = _choices(row[source.choices_column], index, source)
    correct = _answer_index(row[source.answer_column], labels, len(choices), index, source)
    if source.shuffle_choices:
        order = choice_order(question, choices)
        choices, correct = [choices[k] for k in order], order.index(correct)
    return question, choices, correct


def choice_order(question: str, choices: list[str]) -> list[int]:
    """A permutation of ``choices``, seeded by the question and its choices (a SHA-256 of
    them), so one question is shuffled the same way on every run and every machine."""
    digest = hashlib.sha256(json.dumps([question, choices], ensure_ascii=False).encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    return [int(k) for k in rng.permutation(len(choices))]


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
    return [row_string(t, column, index, source) for t in texts], labels


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


register(MultipleChoiceFormat())
