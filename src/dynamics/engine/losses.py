"""The losses a learner computes on one batch (``dynamics.engine.data_contracts.Batch``).

Public API:

- ``to_device(batch, device)``: the batch's tensors on ``device``.
- ``language_model_loss(model, batch, device)``: mean next-token cross-entropy (nats).
- ``training_loss(model, batch, accelerator)``: the loss of this process's slice of a
  global training batch, scaled so that data-parallel averaging gives the global batch's
  mean token loss.
- ``choice_logits(model, batch)``: logits of the K choice letters, shape (B, K).
- ``choice_loss(model, batch, device)``: cross-entropy of the correct letter among them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import Tensor, nn

from dynamics.data.formatting import IGNORE_INDEX
from dynamics.engine.batches import model_inputs
from dynamics.engine.continuations import at_least_float32, continuation_scores, logits_at
from dynamics.engine.data_contracts import Batch


def to_device(batch: Batch, device: torch.device) -> dict[str, Tensor]:
    return {key: value.to(device) for key, value in batch.items()}


def language_model_loss(model: nn.Module, batch: Batch, device: torch.device) -> Tensor:
    """Mean next-token cross-entropy over the unmasked label tokens (HF's own shift)."""
    batch = to_device(batch, device)
    output = model(**model_inputs(batch), labels=batch["labels"])
    loss: Tensor = output.loss
    return at_least_float32(loss)


def training_loss(model: nn.Module, batch: Batch, accelerator: Accelerator) -> Tensor:
    """The training loss of this process's slice of a global batch.

    With one process it is the mean token loss. With several, each rank's slice holds
    a different number of loss tokens, and DDP averages the ranks' gradients: scaling
    each rank's token-loss *sum* by ``world_size / global_tokens`` makes that average
    exactly the gradient of the global batch's mean token loss, as one process with
    the whole batch would compute it.
    """
    world_size = accelerator.num_processes
    if world_size == 1:
        return language_model_loss(model, batch, accelerator.device)
    batch = to_device(batch, accelerator.device)
    local_tokens = (batch["labels"][:, 1:] != IGNORE_INDEX).sum()
    global_tokens = accelerator.reduce(local_tokens, reduction="sum")
    output = model(**model_inputs(batch), labels=batch["labels"], num_items_in_batch=global_tokens)
    loss: Tensor = at_least_float32(output.loss) * world_size
    return loss


def choice_logits(model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
    """Logits of the K choice letters at each prompt's last real token, shape (B, K)
    (letter-restricted scoring, appendix M). Prompts are right-padded. A batch of lm-eval
    questions (``choice_rows``) is scored by each choice's continuation log-likelihood instead."""
    if "choice_rows" in batch:
        return continuation_scores(model, batch)
    last = batch["attention_mask"].sum(dim=1) - 1
    next_token_logits = logits_at(
        model, batch["input_ids"], batch["attention_mask"], last[:, None]
    )[:, 0]
    return at_least_float32(next_token_logits).gather(1, batch["choice_token_ids"])


def choice_loss(model: nn.Module, batch: Batch, device: torch.device) -> Tensor:
    """Cross-entropy of the correct letter among the choice letters' logits."""
    batch = to_device(batch, device)
    return F.cross_entropy(choice_logits(model, batch), batch["answer_index"])
