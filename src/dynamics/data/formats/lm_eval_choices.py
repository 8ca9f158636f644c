"""The rows of an lm-eval task (``source.lm_eval_task``): multiple-choice questions whose
contexts and continuations the task itself builds.

``dynamics.data.lm_eval_tasks`` builds the rows with the task's own prompts,
``lm_eval_tasks.render_chats`` renders them with the chat template when
``source.lm_eval_apply_chat_template``, and ``lm_eval_tasks.encode_pairs`` tokenizes each
(context, continuation) pair as lm-eval's ``hf`` model does. Scored by accuracy, a
``ChoiceExample`` holds each choice's context and continuation (lm-eval's ``acc``, or
``acc_norm`` by ``score_divisors``; each sequence keeps its last ``sequence_length``
tokens); scored by loss, an ``LMExample`` of the context with the correct choice's
continuation as the response, truncated on the left. Either way one warning counts the
documents that do not fit in ``sequence_length``.

A source with ``lm_eval_task`` has ``format="multiple_choice"``; ``format_of`` gives it this
format, which no config names.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np

from dynamics.data.errors import DataError
from dynamics.data.examples import ChoiceExample, LMExample
from dynamics.data.fixed_length import Packing
from dynamics.data.formats.multiple_choice import MultipleChoiceFormat
from dynamics.data.tokens import masked_example

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dynamics.data.source import DataSource

logger = logging.getLogger(__name__)

CONTINUATION_FEATURES = datasets.Features(
    {
        "sequences": datasets.Sequence(datasets.Sequence(datasets.Value("int32"))),
        "continuation_lengths": datasets.Sequence(datasets.Value("int32")),
        "answer_index": datasets.Value("int32"),
        "score_divisors": datasets.Sequence(datasets.Value("float32")),
    }
)
"""The tokenized columns of an lm-eval question scored by accuracy."""


class LmEvalChoicesFormat(MultipleChoiceFormat):
    """The multiple-choice rows an lm-eval task builds; a source names it ``multiple_choice``,
    its own name inherited."""

    def required_columns(self, source: DataSource, columns: list[str]) -> list[str]:
        return ["contexts", "continuations", "answer"]  # what lm_eval_tasks.task_rows builds

    def documents(
        self,
        rows: list[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        source: DataSource,
        start: int,
        chat_template: str | None,
    ) -> list[LMExample]:
        return _continuation_documents(rows, tokenizer, source)

    def encode(
        self,
        rows: list[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        source: DataSource,
        start: int,
        chat_template: str | None,
    ) -> dict[str, list[Any]]:
        if source.metric == "accuracy":
            return _continuation_questions(rows, tokenizer, source)
        return super().encode(rows, tokenizer, source, start, chat_template)

    def features(self, source: DataSource) -> datasets.Features:
        return CONTINUATION_FEATURES if source.metric == "accuracy" else super().features(source)

    def examples(
        self,
        encoded: datasets.Dataset,
        tokenizer: PreTrainedTokenizerBase,
        source: DataSource,
        sequence_length: int,
        packing: Packing,
    ) -> list[LMExample] | list[ChoiceExample]:
        if source.metric == "accuracy":
            return _continuation_examples(encoded, source, sequence_length)
        _warn_cut_documents(source, [len(ids) for ids in encoded["input_ids"]], sequence_length)
        # A long context keeps its continuation.
        left = dataclasses.replace(source, truncation_side="left")
        return super().examples(encoded, tokenizer, left, sequence_length, packing)


LM_EVAL_CHOICES = LmEvalChoicesFormat()
"""The format of every source with an ``lm_eval_task``."""


def _continuation_pairs(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource
) -> list[list[tuple[list[int], list[int]]]]:
    """Each lm-eval row's (context ids, continuation ids) per choice, encoded as lm-eval
    encodes them."""
    from dynamics.data.lm_eval_tasks import encode_pairs, render_chats

    contexts = [c for row in rows for c in row["contexts"]]
    if source.lm_eval_apply_chat_template:
        contexts = render_chats(tokenizer, contexts)
    continuations = [c for row in rows for c in row["continuations"]]
    encoded = encode_pairs(tokenizer, contexts, continuations)
    pairs, start = [], 0
    for row in rows:
        pairs.append(encoded[start : start + len(row["contexts"])])
        start += len(row["contexts"])
    return pairs


def _continuation_questions(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource
) -> dict[str, list[Any]]:
    """Each lm-eval row's K token sequences, their continuations' lengths and its answer."""
    pairs = _continuation_pairs(rows, tokenizer, source)
    return {
        "sequences": [[context + continuation for context, continuation in row] for row in pairs],
        "continuation_lengths": [[len(continuation) for _, continuation in row] for row in pairs],
        "answer_index": [int(row["answer"]) for row in rows],
        "score_divisors": [_score_divisors(row, source) for row in rows],
    }


def _score_divisors(row: Mapping[str, Any], source: DataSource) -> list[float]:
    """What each choice's summed log-likelihood is divided by: its length in characters
    for lm-eval's ``acc_norm`` (``process_results``), 1 for ``acc``."""
    if source.lm_eval_metric == "acc_norm":
        return [float(length) for length in row["choice_lengths"]]
    return [1.0] * len(row["contexts"])


def _continuation_documents(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource
) -> list[LMExample]:
    """Each lm-eval row's correct choice: its context, then its continuation carrying the loss."""
    pairs = _continuation_pairs(rows, tokenizer, source)
    return [
        masked_example(*row_pairs[int(row["answer"])])
        for row, row_pairs in zip(rows, pairs, strict=True)
    ]


def _continuation_examples(
    encoded: datasets.Dataset, source: DataSource, sequence_length: int
) -> list[ChoiceExample]:
    """Tokenized lm-eval questions as examples; a sequence longer than ``sequence_length``
    keeps its last tokens (lm-eval cuts its model's max_length the same way), with a warning."""
    _warn_cut_documents(
        source, [max(map(len, sequences)) for sequences in encoded["sequences"]], sequence_length
    )
    examples = []
    for index, (sequences, lengths, answer, divisors) in enumerate(
        zip(
            encoded["sequences"],
            encoded["continuation_lengths"],
            encoded["answer_index"],
            encoded["score_divisors"],
            strict=True,
        )
    ):
        if max(lengths) >= sequence_length:
            raise DataError(
                f"{source.description}, question {index}: a continuation of {max(lengths)} tokens "
                f"does not fit after a context within sequence_length={sequence_length}; raise "
                "sequence_length (training.sequence_length in a run config)"
            )
        kept = [np.asarray(ids[-sequence_length:], dtype=np.int32) for ids in sequences]
        examples.append(
            ChoiceExample(
                input_ids=np.concatenate(kept),
                choice_token_ids=np.zeros(0, dtype=np.int32),
                answer_index=int(answer),
                sequence_lengths=np.asarray([len(ids) for ids in kept], dtype=np.int32),
                continuation_lengths=np.asarray(lengths, dtype=np.int32),
                score_divisors=np.asarray(divisors, dtype=np.float32),
            )
        )
    return examples


def _warn_cut_documents(source: DataSource, longest: Sequence[int], sequence_length: int) -> None:
    """One warning with the count of lm-eval documents whose context and continuation do not
    fit in ``sequence_length``: their contexts lose their first tokens, so their scores are no
    longer lm-eval's (unless lm-eval's model cuts at the same length)."""
    cut = sum(length > sequence_length for length in longest)
    if cut:
        logger.warning(
            "%s: %d of %d documents have a context and continuation longer than "
            "sequence_length=%d; their contexts keep their last tokens, so their scores differ "
            "from lm-eval's (raise training.sequence_length)",
            source.description,
            cut,
            len(longest),
            sequence_length,
        )
