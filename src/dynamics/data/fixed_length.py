"""Documents to examples of a fixed length: truncated one by one, or packed into blocks.

With ``packing=False`` every document is cut to its first ``sequence_length`` tokens (with
``source.truncation_side == "left"``, to the prompt's leading special tokens, e.g. BOS,
followed by the window that ends with its last token, or starts at its response when the
response alone is longer: the middle of the prompt is cut, so a long document is best put
before its question or instruction), and an example left with no response token (a prompt
as long as the sequence) is dropped (a warning says how many); when every example is
dropped the source is refused with ``DataError``. With ``packing=True`` the documents (each
ending in EOS or the template's end-of-turn) are concatenated, labels alongside ids, and cut
into blocks of ``sequence_length``; the last block may be shorter, and a block without any
loss token (all prompt) is dropped. Packed documents attend to each other, as in the usual
causal-LM packing. With ``packing="per-document"`` they do not: each example also carries
``position_ids`` that restart at every document, and the label of each document's first
token is -100, so a model given the positions without an attention mask (``collate_lm`` does
so) computes every document's losses as it would unpacked (a document cut at a block's end
continues from its position in the next block, seeing only that block's part).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

import numpy as np

from dynamics.data.errors import DataError
from dynamics.data.examples import IGNORE_INDEX, LMExample

if TYPE_CHECKING:
    from dynamics.data.source import DataSource

logger = logging.getLogger(__name__)

Packing = bool | Literal["per-document"]
"""False: one example per document, truncated. True: documents concatenated and cut into
blocks, attending to each other. ``"per-document"``: blocks in which each document attends
only to itself."""
PACKING_MODES: tuple[Packing, ...] = (False, True, "per-document")


def fixed_length(
    documents: list[LMExample],
    sequence_length: int,
    source: DataSource,
    packing: Packing,
    special_ids: frozenset[int],
) -> list[LMExample]:
    """``documents`` packed (``packing`` True or ``"per-document"``) or truncated to
    ``sequence_length``; ``DataError`` when no example keeps a token with a loss."""
    examples = (
        _pack(documents, sequence_length, per_document=packing == "per-document")
        if packing
        else _truncate(documents, sequence_length, source, special_ids)
    )
    if documents and not examples:
        raise DataError(
            f"{source.description}: no example keeps a response token within "
            f"sequence_length={sequence_length}: every prompt fills the sequence; raise "
            "sequence_length (training.sequence_length in a run config)"
        )
    return examples


def _truncate(
    documents: list[LMExample],
    sequence_length: int,
    source: DataSource,
    special_ids: frozenset[int] = frozenset(),
) -> list[LMExample]:
    examples = []
    for doc in documents:
        # Left truncation keeps the prompt's leading special tokens (BOS, a template's
        # start-of-turn) and cuts what follows them; a response longer than the rest of the
        # sequence keeps its first tokens.
        head, start = 0, 0
        if source.truncation_side == "left" and len(doc) > sequence_length:
            response_start = int(np.argmax(doc.labels != IGNORE_INDEX))
            while (
                head < min(response_start, sequence_length - 1)
                and int(doc.input_ids[head]) in special_ids
            ):
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
