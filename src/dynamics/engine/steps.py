"""Optimizer steps on a :class:`~dynamics.engine.training_state.TrainingState`: gradient
accumulation, clipping, and what happens at a non-finite loss or gradient.

Public API:

- ``OptimizerSteps.take(steps, next_batch, loss, probing)``: steps of the main run or of a
  probe in which every process takes part.
- ``OptimizerSteps.take_alone(steps, next_slices)``: steps of a probe that this process
  runs on its own, each micro-batch given as every rank's slice of the global batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import nullcontext

import torch
from torch import Tensor

from dynamics.core.learner import Diverged
from dynamics.data.formatting import IGNORE_INDEX
from dynamics.engine.batches import model_inputs
from dynamics.engine.continuations import at_least_float32
from dynamics.engine.data_contracts import Batch
from dynamics.engine.losses import to_device
from dynamics.engine.training_state import TrainingState

logger = logging.getLogger(__name__)

Accumulation = Callable[[], tuple[Tensor, list[int]]]
"""Backward one optimizer step's micro-batches; returns the step's loss (on device) and the
dataset of each micro-batch."""


class OptimizerSteps:
    """Takes optimizer steps on ``state``.

    A step whose loss or gradient norm is not finite is never applied. In a probe it
    raises :class:`Diverged`; in the main run the step is skipped (its batches are
    consumed, the parameters, optimizer and schedule stay as they were), recorded in
    ``state.skipped_steps``, and once more than ``max_skipped_steps`` were skipped the run
    stops with :class:`Diverged`.

    Args:
        state: the training state the steps change.
        dataset_names: the N fine-tuning datasets, named in errors and skipped-step records.
        gradient_accumulation: micro-batches per optimizer step.
        max_grad_norm: the gradient-norm clip; None measures the norm without clipping.
        max_skipped_steps: the main run's non-finite steps tolerated before it stops.
        average_gradients: average the gradients across processes after the backward (a
            model that no data-parallel wrapper averages for).
    """

    def __init__(
        self,
        state: TrainingState,
        dataset_names: Sequence[str],
        *,
        gradient_accumulation: int,
        max_grad_norm: float | None,
        max_skipped_steps: int,
        average_gradients: bool,
    ) -> None:
        self.state = state
        self.dataset_names = list(dataset_names)
        self.gradient_accumulation = gradient_accumulation
        self.max_grad_norm = max_grad_norm
        self.max_skipped_steps = max_skipped_steps
        self.average_gradients = average_gradients

    def take(
        self,
        steps: int,
        next_batch: Callable[[], tuple[int, Batch]],
        loss: Callable[[Batch], Tensor],
        *,
        probing: bool,
    ) -> Tensor:
        """Take ``steps`` optimizer steps, every process taking part, each micro-batch
        ``(dataset, batch)`` from ``next_batch`` and its loss from ``loss``; returns the last
        step's loss (on device)."""
        accelerator = self.state.accelerator

        def accumulate() -> tuple[Tensor, list[int]]:
            step_loss = torch.zeros((), device=accelerator.device)
            datasets = []
            for micro_step in range(self.gradient_accumulation):
                dataset, batch = next_batch()
                datasets.append(dataset)
                last = micro_step == self.gradient_accumulation - 1
                # Under DDP, gradients are all-reduced only on the last micro-batch.
                with nullcontext() if last else accelerator.no_sync(self.state.model):
                    micro_loss = loss(batch) / self.gradient_accumulation
                    accelerator.backward(micro_loss)
                step_loss = step_loss + micro_loss.detach()
            if self.average_gradients:
                self._all_reduce_gradients()
            return step_loss, datasets

        return self._steps(steps, accumulate, probing=probing, alone=False)

    def take_alone(self, steps: int, next_slices: Callable[[], tuple[int, list[Batch]]]) -> Tensor:
        """Take ``steps`` optimizer steps of a probe this process runs on its own, each
        micro-batch ``(dataset, every rank's slice)`` from ``next_slices``; returns the last
        step's loss (on device). Nothing is exchanged with the other processes."""
        accelerator = self.state.accelerator

        def accumulate() -> tuple[Tensor, list[int]]:
            step_loss = torch.zeros((), device=accelerator.device)
            datasets = []
            for _ in range(self.gradient_accumulation):
                dataset, slices = next_slices()
                datasets.append(dataset)
                step_loss = step_loss + self._backward_alone(slices)
            return step_loss, datasets

        return self._steps(steps, accumulate, probing=True, alone=True)

    def _steps(self, steps: int, accumulate: Accumulation, *, probing: bool, alone: bool) -> Tensor:
        state = self.state
        state.model.train()
        step_loss = torch.zeros((), device=state.accelerator.device)
        for _ in range(steps):
            step_loss, datasets = accumulate()
            # Without clipping, an infinite max norm measures without changing anything.
            max_norm = self.max_grad_norm if self.max_grad_norm is not None else float("inf")
            grad_norm = state.accelerator.clip_grad_norm_(state.trainable_parameters, max_norm)
            if not self._finite(step_loss, grad_norm, alone=alone):
                state.optimizer.zero_grad(set_to_none=True)
                names = sorted({self.dataset_names[j] for j in datasets})
                if probing:
                    raise Diverged(f"a probe on {names[0]} reached a non-finite loss or gradient")
                self._skip_step(names)
                continue
            if not probing:
                state.main_steps += 1
            state.optimizer.step()
            # An fp16 step skipped for inf/NaN gradients must not advance the schedule.
            if not state.optimizer.step_was_skipped:
                state.lr_scheduler.step()
            state.optimizer.zero_grad(set_to_none=True)
        return step_loss

    def _backward_alone(self, slices: Sequence[Batch]) -> Tensor:
        """Backward one micro-batch of a probe this process runs on its own: the global
        batch's per-process ``slices`` in turn on the unwrapped module, each slice's token
        loss summed over the global batch's loss tokens, so the accumulated gradient is that
        of the global batch's mean token loss, as all processes together compute it."""
        accelerator = self.state.accelerator
        model = accelerator.unwrap_model(self.state.model)
        batches = [to_device(batch, accelerator.device) for batch in slices]
        tokens = torch.stack([(b["labels"][:, 1:] != IGNORE_INDEX).sum() for b in batches]).sum()
        total = torch.zeros((), device=accelerator.device)
        for batch in batches:
            output = model(**model_inputs(batch), labels=batch["labels"], num_items_in_batch=tokens)
            loss = at_least_float32(output.loss) / self.gradient_accumulation
            accelerator.backward(loss)
            total = total + loss.detach()
        return total

    def _all_reduce_gradients(self) -> None:
        """Average the gradients over the processes, as DDP does for a wrapped model (the
        Trainer hands callbacks its unwrapped model)."""
        for p in self.state.trainable_parameters:
            if p.grad is not None:
                p.grad = self.state.accelerator.reduce(p.grad, reduction="mean")

    def _finite(self, step_loss: Tensor, grad_norm: Tensor | float | None, *, alone: bool) -> bool:
        """Whether this step may be applied; under several processes taking part, the same
        answer on every rank (a process ``alone`` decides by itself)."""
        accelerator = self.state.accelerator
        loss = step_loss.reshape(1)
        if accelerator.num_processes > 1 and not alone:
            loss = accelerator.reduce(loss, reduction="sum")  # NaN on one rank: NaN everywhere
        ok = torch.isfinite(loss).all()
        # Under fp16 an infinite gradient is the loss scaler's overflow, which the scaler
        # itself skips and recovers from; the (all-reduced) norm is checked otherwise.
        if accelerator.scaler is None and grad_norm is not None:
            ok = ok & torch.isfinite(torch.as_tensor(grad_norm, device=ok.device)).all()
        return bool(ok)  # one host sync per step

    def _skip_step(self, datasets: list[str]) -> None:
        state = self.state
        step = state.main_steps  # the number recorded, logged and reported alike
        state.skipped_steps.append({"step": step, "datasets": datasets})
        state.main_steps += 1
        logger.warning(
            "step %d: non-finite loss or gradient on %s; the step is skipped", step, datasets
        )
        if len(state.skipped_steps) > self.max_skipped_steps:
            raise Diverged(
                f"training diverged: {len(state.skipped_steps)} steps had a non-finite loss or "
                f"gradient (the last at step {step}, on {', '.join(datasets)}), more than "
                f"training.max_skipped_steps={self.max_skipped_steps}: lower optimizer.lr, set "
                "optimizer.max_grad_norm, or use fp32 (training.mixed_precision: no), and start "
                "again"
            )
