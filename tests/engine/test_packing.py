"""Packing per document: every document scores as it would alone, under each attention kernel."""

from __future__ import annotations

import datasets
import pytest
import torch
import torch.nn.functional as F

from dynamics.data.formatting import IGNORE_INDEX, build_examples, pad_token_id
from dynamics.data.loading import DataSource
from dynamics.engine.batches import collate_lm, model_inputs
from dynamics.engine.config import ModelConfig
from dynamics.engine.model import load_causal_lm
from tests.engine.test_run import TINY_LLAMA
from tests.fixtures.tiny_tokenizer import tiny_tokenizer

DOCUMENTS = [
    "the cat sat on the mat and looked at the door",
    "a dog ran",
    "wind and rain over the hills, then sun for a while, then rain again",
    "one two three four five",
    "short",
]


def token_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[float, int]:
    """Sum and count of the next-token cross-entropies over the labelled tokens."""
    with torch.no_grad():
        logits = model(**model_inputs(batch)).logits[:, :-1].float()
    labels = batch["labels"][:, 1:]
    total = F.cross_entropy(
        logits.transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return float(total), int((labels != IGNORE_INDEX).sum())


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_documents_packed_per_document_score_as_unpacked(attention):
    torch.manual_seed(0)
    model = load_causal_lm(
        ModelConfig(init_config=TINY_LLAMA, tokenizer="unused", attn_implementation=attention)
    )
    model.eval()
    tokenizer = tiny_tokenizer()
    rows = datasets.Dataset.from_dict({"text": DOCUMENTS})
    pad = pad_token_id(tokenizer)

    def examples(packing, sequence_length):
        return build_examples(
            rows,
            tokenizer,
            DataSource(format="text"),
            sequence_length=sequence_length,
            packing=packing,
        )

    alone = examples(False, 256)
    lengths = [len(e) for e in alone]
    # Blocks that end where a document ends: the first three documents fill the first
    # block, the last two the second, which is shorter and so right-padded.
    block = sum(lengths[:3])
    assert sum(lengths[3:]) < block
    packed = examples("per-document", block)
    assert [len(e) for e in packed] == [block, sum(lengths[3:])]
    batch = collate_lm(packed, pad)
    assert "attention_mask" not in batch
    assert batch["position_ids"][0].tolist() == [p for n in lengths[:3] for p in range(n)]

    alone_sum, alone_count = token_losses(model, collate_lm(alone, pad))
    packed_sum, packed_count = token_losses(model, batch)
    assert packed_count == alone_count
    assert packed_sum == pytest.approx(alone_sum, rel=1e-5)
    # The same blocks and labels with attention across documents score otherwise: the
    # check can fail.
    across = collate_lm(examples(True, block), pad)
    assert "position_ids" not in across
    across["labels"] = batch["labels"]
    across_sum, across_count = token_losses(model, across)
    assert across_count == alone_count
    assert abs(across_sum - alone_sum) > 10 * 1e-5 * alone_sum  # ten times the tolerance above


def test_a_run_trains_on_blocks_packed_per_document(tokenizer_dir, tmp_path):
    import numpy as np

    from dynamics.engine.components import build_run
    from dynamics.engine.config import RunConfig, apply_overrides
    from tests.engine.test_run import tiny_config

    data = apply_overrides(
        tiny_config(tokenizer_dir, tmp_path / "run"), ["training.packing=per-document"]
    )
    built = build_run(RunConfig.from_dict(data))
    learner = built.learner
    weights = np.array([0.5, 0.5])
    _, batch = learner.sampler.next_batch(weights)
    assert "position_ids" in batch and "attention_mask" not in batch
    math = learner.domain_names.index("math")
    before = learner.evaluate("eval").means()[math]
    learner.train(8, weights)
    assert learner.evaluate("eval").means()[math] < before
