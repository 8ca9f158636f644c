"""Multiple-choice scores read from the logits of the positions they need only.

Letter scoring reads one position per prompt and continuation scoring the positions before
each continuation token; the model projects only those hidden states onto the vocabulary.
The scores must be those of the full logits, under a LoRA wrapper too, and a model whose
forward does not take ``logits_to_keep`` must still be scored.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from torch import nn

from dynamics.data.formatting import IGNORE_INDEX
from dynamics.engine.continuations import continuation_scores
from dynamics.engine.losses import choice_logits
from tests.engine.conftest import choice_batch, lm_batch, tiny_model


def _full_letter_scores(model: nn.Module, batch: dict) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    last = batch["attention_mask"].sum(dim=1) - 1
    return logits[torch.arange(len(last)), last].gather(1, batch["choice_token_ids"])


def _full_continuation_scores(model: nn.Module, batch: dict) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["labels"][:, 1:]
    log_probs = F.log_softmax(logits[:, :-1].float(), dim=-1)
    token_scores = log_probs.gather(2, targets.clamp(min=0)[..., None]).squeeze(-1)
    row_scores = torch.where(targets != IGNORE_INDEX, token_scores, 0.0).sum(dim=1)
    rows = batch["choice_rows"]
    return torch.where(rows >= 0, row_scores[rows.clamp(min=0)], -torch.inf)


def _continuation_batch(generator: torch.Generator) -> dict:
    """Three questions of up to three choices (the last has two), one right-padded row per
    choice whose last 1-3 real tokens are the continuation."""
    batch = lm_batch(generator, (3, 250), batch_size=8, length=14)
    lengths = batch["attention_mask"].sum(dim=1)
    continuation = torch.randint(1, 4, (8,), generator=generator)
    positions = torch.arange(14)[None, :]
    scored = (positions < lengths[:, None]) & (positions >= (lengths - continuation)[:, None])
    return {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "labels": batch["input_ids"].masked_fill(~scored, IGNORE_INDEX),
        "choice_rows": torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, -1]]),
        "score_divisors": torch.ones(3, 3),  # acc: summed log-likelihoods, undivided
        "answer_index": torch.tensor([0, 2, 1]),
    }


def _lm_head_rows(model: nn.Module, score, batch: dict) -> int:
    """How many hidden states ``score`` projected onto the vocabulary."""
    seen: list[int] = []
    head = model.get_output_embeddings()
    handle = head.register_forward_hook(
        lambda module, inputs, output: seen.append(inputs[0][..., 0].numel())
    )
    try:
        score(model, batch)
    finally:
        handle.remove()
    return sum(seen)


class _WithoutLogitsToKeep(nn.Module):
    """A causal LM whose forward takes only ids and mask, as some remote-code models do."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)


class _IntOnlyLogitsToKeep(nn.Module):
    """A model from outside transformers whose ``logits_to_keep`` takes an int only (a count
    of last positions), as remote code often has it: given a tensor it would fail or read
    the wrong positions."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int = 0
    ):
        if not isinstance(logits_to_keep, int):
            raise TypeError("logits_to_keep must be an int")
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep
        )


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_scores_equal_the_full_logits_ones(arch, lora):
    model = tiny_model(arch).eval()
    if lora:
        model = get_peft_model(
            model,
            LoraConfig(
                r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
            ),
        ).eval()
    generator = torch.Generator().manual_seed(0)
    letters, continuations = (
        choice_batch(generator, batch_size=6, length=12),
        _continuation_batch(generator),
    )
    with torch.no_grad():
        torch.testing.assert_close(
            choice_logits(model, letters), _full_letter_scores(model, letters)
        )
        scores = continuation_scores(model, continuations)
        torch.testing.assert_close(scores, _full_continuation_scores(model, continuations))
    assert torch.isinf(scores[2, 2]) and torch.isfinite(scores[:, :2]).all()


def test_only_the_scored_positions_reach_the_vocabulary():
    model = tiny_model("llama").eval()
    generator = torch.Generator().manual_seed(1)
    letters, continuations = (
        choice_batch(generator, batch_size=6, length=12),
        _continuation_batch(generator),
    )
    with torch.no_grad():
        assert _lm_head_rows(model, choice_logits, letters) == 6
        scored = int((continuations["labels"][:, 1:] != IGNORE_INDEX).sum())
        assert (
            _lm_head_rows(model, continuation_scores, continuations)
            == scored
            < continuations["input_ids"].numel()
        )


@pytest.mark.parametrize(
    ("wrapper", "batch_size"),
    [(_WithoutLogitsToKeep, 5), (_IntOnlyLogitsToKeep, 1)],
    ids=["forward-without-it", "int-only-outside-transformers"],
)
def test_a_model_that_cannot_take_positions_is_scored_from_every_logit(wrapper, batch_size):
    inner = tiny_model("llama").eval()
    model = wrapper(inner)
    generator = torch.Generator().manual_seed(2)
    letters, continuations = (
        choice_batch(generator, batch_size=batch_size, length=11),
        _continuation_batch(generator),
    )
    with torch.no_grad():
        torch.testing.assert_close(
            choice_logits(model, letters), _full_letter_scores(inner, letters)
        )
        torch.testing.assert_close(
            continuation_scores(model, continuations),
            _full_continuation_scores(inner, continuations),
        )
        assert (
            _lm_head_rows(inner, lambda m, b: choice_logits(model, b), letters)
            == letters["input_ids"].numel()
        )
