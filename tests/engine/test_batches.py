"""Collation and the fixed evaluation batches."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from dynamics.data import ChoiceExample, LMExample
from dynamics.engine.batches import EvalBatches, collate_choice, collate_lm

PAD = 0


def lm(ids: list[int], prompt: int = 0) -> LMExample:
    array = np.asarray(ids, dtype=np.int32)
    labels = array.copy()
    labels[:prompt] = -100
    return LMExample(input_ids=array, labels=labels)


def choice(ids: list[int], letters: list[int], answer: int) -> ChoiceExample:
    return ChoiceExample(
        input_ids=np.asarray(ids, dtype=np.int32),
        choice_token_ids=np.asarray(letters, dtype=np.int32),
        answer_index=answer,
    )


def test_collate_lm_right_pads_and_masks() -> None:
    batch = collate_lm([lm([5, 6, 7, 8], prompt=2), lm([9, 10])], pad_id=PAD)
    assert all(t.dtype == torch.long for t in batch.values())
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, PAD, PAD]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, -100, 7, 8], [9, 10, -100, -100]]


def test_collate_choice_scoring_position_and_choice_padding() -> None:
    batch = collate_choice(
        [choice([3, 4, 5], [11, 12, 13, 14], 2), choice([6, 7], [11, 12], 1)], pad_id=PAD
    )
    assert batch["input_ids"].tolist() == [[3, 4, 5], [6, 7, PAD]]
    position = batch["attention_mask"].sum(1) - 1
    assert batch["input_ids"][torch.arange(2), position].tolist() == [
        5,
        7,
    ]  # the last prompt tokens
    assert batch["choice_token_ids"].tolist() == [[11, 12, 13, 14], [11, 12, 11, 11]]
    assert batch["answer_index"].tolist() == [2, 1]
    # Repeated ids never change the letter-restricted argmax: logits favouring letter 12.
    logits = torch.zeros(2, 20)
    logits[:, 12] = 5.0
    logits[:, 11] = 1.0
    scores = logits.gather(1, batch["choice_token_ids"])
    assert scores.argmax(1).tolist() == [1, 1]


def lm_pool(n: int) -> list[LMExample]:
    return [lm([100 + i, 1, 2][: 1 + i % 3]) for i in range(n)]


def first_ids(batches: tuple[dict[str, torch.Tensor], ...]) -> list[int]:
    return [int(i) for b in batches for i in b["input_ids"][:, 0]]


def test_eval_batches_are_fixed_and_deterministic() -> None:
    eval_examples, test_examples = lm_pool(50), lm_pool(30)
    kwargs = {"num_batches": 4, "batch_size": 5, "pad_id": PAD}
    a = EvalBatches.build("d", eval_examples, test_examples, seed=1, **kwargs)
    b = EvalBatches.build("d", eval_examples, test_examples, seed=1, **kwargs)
    c = EvalBatches.build("d", eval_examples, test_examples, seed=2, **kwargs)
    assert a.metric == "loss"
    assert len(a.eval_batches) == len(a.test_batches) == 4
    assert first_ids(a.eval_batches) == first_ids(b.eval_batches) and first_ids(
        a.test_batches
    ) == first_ids(b.test_batches)
    assert first_ids(a.eval_batches) != first_ids(c.eval_batches)
    assert (
        len(set(first_ids(a.eval_batches))) == 20
    )  # a subset of distinct examples when there are enough
    # The reduced evaluation is the first R batches of the main one, the same tensors.
    assert all(x is y for x, y in zip(a.batches("eval", 2), a.eval_batches[:2], strict=True))
    assert a.batches("test") is a.test_batches


def test_eval_batches_cycle_a_small_split_evenly() -> None:
    batches = EvalBatches.build(
        "d", lm_pool(7), lm_pool(7), num_batches=5, batch_size=4, pad_id=PAD, seed=0
    )
    counts = Counter(first_ids(batches.eval_batches))
    assert sorted(counts) == list(range(100, 107))
    assert max(counts.values()) - min(counts.values()) <= 1


def test_accuracy_metric_from_choice_examples() -> None:
    pool = [choice([1, 2, i], [11, 12], i % 2) for i in range(10)]
    batches = EvalBatches.build(
        "d", pool[:5], pool[5:], num_batches=2, batch_size=3, pad_id=PAD, seed=0
    )
    assert batches.metric == "accuracy"
    assert set(batches.eval_batches[0]) == {
        "input_ids",
        "attention_mask",
        "choice_token_ids",
        "answer_index",
    }


def test_eval_batches_errors() -> None:
    with pytest.raises(ValueError, match="domain 'd' needs eval and test examples"):
        EvalBatches.build("d", lm_pool(3), [], num_batches=1, batch_size=1, pad_id=PAD, seed=0)
    with pytest.raises(ValueError, match="mix kinds"):
        EvalBatches.build(
            "d",
            lm_pool(3),
            [choice([1], [2, 3], 0)],
            num_batches=1,
            batch_size=1,
            pad_id=PAD,
            seed=0,
        )
    batches = EvalBatches.build(
        "d", lm_pool(3), lm_pool(3), num_batches=2, batch_size=1, pad_id=PAD, seed=0
    )
    with pytest.raises(ValueError, match=r"num_batches=3 outside \[1, 2\]"):
        batches.batches("eval", 3)
    with pytest.raises(ValueError, match="split='train'"):
        batches.batches("train")
