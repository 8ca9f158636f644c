"""Evaluation on the fixed batches of the evaluation domains.

Public API:

- ``Evaluator.evaluate(domains, split, num_batches, alone)``: per-batch metrics ``(M, R)``,
  shared out among the processes and gathered, or all computed by one process ``alone``.
- ``batch_metric(domain, batch, model, device)``: one batch's metric and its expected
  accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from dynamics.core.learner import Evaluation
from dynamics.engine.data_contracts import Batch, EvaluationDomain, split_batches
from dynamics.engine.losses import choice_logits, language_model_loss, to_device
from dynamics.engine.training_state import TrainingState


def batch_metric(
    domain: EvaluationDomain, batch: Batch, model: nn.Module, device: torch.device
) -> Tensor:
    """Mean token cross-entropy (nats) of a loss domain's batch, negative accuracy (in
    [-1, 0]) of an accuracy domain's, and the same with the accuracy's expected value:
    the mean probability of the correct choice under the softmax of the choices' scores
    (a loss domain's value twice). Shape (2,), float64."""
    if domain.metric == "loss":
        loss = language_model_loss(model, batch, device).double()
        return torch.stack([loss, loss])
    batch = to_device(batch, device)
    scores = choice_logits(model, batch)
    answers = batch["answer_index"]
    # float64: k/n exactly rounded, where float32 made 63/72 right read as 0.87499999.
    accuracy = (scores.argmax(dim=-1) == answers).double().mean()
    expected = scores.double().softmax(dim=-1).gather(1, answers[:, None]).mean()
    return -torch.stack([accuracy, expected])


class Evaluator:
    """Evaluates the model of ``state`` on fixed batches."""

    def __init__(self, state: TrainingState) -> None:
        self.state = state

    def evaluate(
        self,
        domains: Sequence[EvaluationDomain],
        split: str,
        num_batches: int | None,
        *,
        alone: bool,
    ) -> Evaluation:
        """Per-batch metrics ``(M, R)`` on the first ``num_batches`` fixed batches of ``split``
        (``"eval"`` or ``"test"``; all when None) of each of ``domains``: mean token
        cross-entropy (nats) for loss domains, negative accuracy (in [-1, 0]) for accuracy
        domains.

        Runs in eval mode (no dropout) without gradients; draws no random numbers and
        leaves the training state untouched. Under several processes the batches are
        shared out (batch ``b`` to rank ``b mod P``) and the per-batch values gathered, so
        every rank returns the whole array, the same as one process computes; a process
        ``alone`` (probing on its own) evaluates every batch itself.
        """
        state, accelerator = self.state, self.state.accelerator
        batches = [split_batches(domain, split) for domain in domains]
        available = len(batches[0])
        count = available if num_batches is None else num_batches
        if not 1 <= count <= available:
            raise ValueError(
                f"num_batches={num_batches} outside [1, {available}] for split {split!r}"
            )
        world = 1 if alone else accelerator.num_processes
        mine = range(accelerator.process_index if world > 1 else 0, count, world)
        evaluated = list(mine)
        if state.sharded and world > 1:
            # A sharded forward gathers parameters from every rank, so all ranks run the
            # same number of forwards: the ranks with one batch fewer evaluate batch 0
            # again and drop it.
            evaluated += [0] * (-(-count // world) - len(evaluated))
        # The module itself, not its DDP wrapper: ranks evaluate different numbers of
        # batches, and a wrapper's forward may synchronise buffers across ranks.
        model = (
            accelerator.unwrap_model(state.model) if accelerator.num_processes > 1 else state.model
        )
        was_training = state.model.training
        state.model.eval()
        try:
            with torch.no_grad():
                values = torch.stack(  # (2, M, batches): the metrics, then the expected values
                    [
                        torch.stack(
                            [
                                batch_metric(domain, domain_batches[b], model, accelerator.device)
                                for b in evaluated
                            ]
                        )
                        .double()[: len(mine)]
                        .T
                        if evaluated
                        else torch.zeros((2, 0), dtype=torch.float64, device=accelerator.device)
                        for domain, domain_batches in zip(domains, batches, strict=True)
                    ],
                    dim=1,
                )
        finally:
            state.model.train(was_training)
            state.reshard()
        if world > 1:
            values = torch.stack([self._gather_batches(v, count) for v in values])
        # One device-to-host copy for the whole evaluation instead of one sync per batch.
        metrics, expected = values.cpu().numpy()
        return Evaluation(metrics, expected)

    def _gather_batches(self, local: Tensor, count: int) -> Tensor:
        """The (M, count) array from each rank's (M, its share) columns (rank r holds batches
        r, r + P, r + 2P, ...)."""
        accelerator = self.state.accelerator
        world = accelerator.num_processes
        width = -(-count // world)
        padded = torch.zeros((local.shape[0], width), dtype=local.dtype, device=local.device)
        padded[:, : local.shape[1]] = local
        gathered = accelerator.gather(padded.unsqueeze(0))  # (P, M, width)
        full = torch.empty((local.shape[0], count), dtype=local.dtype, device=local.device)
        for rank in range(world):
            full[:, rank::world] = gathered[rank, :, : len(range(rank, count, world))]
        return full
