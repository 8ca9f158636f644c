"""The gradient-alignment baseline (paper appendix K): slopes from gradient inner products
instead of probes.

Public API:

- ``alignment_slopes(state, domains, num_datasets, num_batches)``: the slope matrix
  ``S_ij = -lr * <g_i, d_j>``, shape (M, N).
- ``adam_direction(gradient, parameters, optimizer)``: the bias-corrected Adam direction of
  one step on ``gradient``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext

import numpy as np
import torch
from torch import Tensor, nn

from dynamics.engine.data_contracts import Batch, EvaluationDomain
from dynamics.engine.losses import choice_loss, language_model_loss
from dynamics.engine.training_state import RNGState, TrainingState

Loss = Callable[[Batch], Tensor]


def alignment_slopes(
    state: TrainingState, domains: Sequence[EvaluationDomain], num_datasets: int, num_batches: int
) -> np.ndarray:
    """Gradient-alignment slope matrix ``S_ij = -lr * <g_i, d_j>``, shape (M, N), in
    metric units per optimizer step.

    - ``g_i``: mean gradient of domain i's metric over its first ``num_batches`` eval
      batches. Accuracy is piecewise constant, so accuracy domains use the
      cross-entropy of the answer among the choice letters' logits (the softmax
      version of letter-restricted argmax) as a differentiable stand-in for
      ``-accuracy``.
    - ``d_j``: the bias-corrected Adam direction ``m_hat / (sqrt(v_hat) + eps)`` that one
      Adam step on ``g_j`` would take from the current optimizer state, ``g_j`` being
      the mean training-loss gradient over ``num_batches`` batches the sampler draws
      with one-hot weights on dataset j (see :func:`adam_direction`). Decoupled weight
      decay is not part of the paper's direction and is left out.
    - ``lr``: the current learning rate of each parameter's group.

    Gradients are computed as a training step computes them (train mode: dropout and
    gradient checkpointing active). The sampler and RNG are restored afterwards, so
    the training state is unchanged. Memory: N + 2 copies of the trainable parameters.
    """
    if num_batches < 1:
        raise ValueError(f"num_batches must be >= 1, got {num_batches}")
    available = len(domains[0].eval_batches)
    if num_batches > available:
        raise ValueError(
            f"num_batches={num_batches} exceeds the {available} eval batches per domain"
        )
    device = state.accelerator.device

    def lm_loss(batch: Batch) -> Tensor:
        return language_model_loss(state.model, batch, device)

    def letter_loss(batch: Batch) -> Tensor:
        return choice_loss(state.model, batch, device)

    sampler_state = copy.deepcopy(state.sampler.state_dict())
    rng = RNGState.capture()
    was_training = state.model.training
    state.model.train()
    try:
        directions = []
        for j in range(num_datasets):
            one_hot = np.eye(num_datasets)[j]
            batches = (state.sampler.next_batch(one_hot)[1] for _ in range(num_batches))
            gradient = _mean_gradient(state, batches, num_batches, lm_loss)
            directions.append(
                adam_direction(gradient, state.trainable_parameters, state.torch_optimizer)
            )
        learning_rates = _parameter_learning_rates(
            state.trainable_parameters, state.torch_optimizer
        )
        slopes = np.zeros((len(domains), len(directions)))
        for i, domain in enumerate(domains):
            loss_fn = lm_loss if domain.metric == "loss" else letter_loss
            gradient = _mean_gradient(
                state, domain.eval_batches[:num_batches], num_batches, loss_fn
            )
            for j, direction in enumerate(directions):
                inner = torch.stack(
                    [
                        lr * torch.sum(g * d)
                        for lr, g, d in zip(learning_rates, gradient, direction, strict=True)
                    ]
                ).sum()
                slopes[i, j] = -float(inner)
    finally:
        state.optimizer.zero_grad(set_to_none=True)
        state.model.train(was_training)
        state.sampler.load_state_dict(sampler_state)
        rng.apply()
    return slopes


def _mean_gradient(
    state: TrainingState, batches: Iterable[Batch], count: int, loss_fn: Loss
) -> list[Tensor]:
    """Mean gradient of ``loss_fn`` over ``count`` batches, one tensor per trainable
    parameter (unscaled when fp16 loss scaling is on). Leaves ``.grad`` cleared."""
    accelerator = state.accelerator
    state.optimizer.zero_grad(set_to_none=True)
    for k, batch in enumerate(batches):
        with nullcontext() if k == count - 1 else accelerator.no_sync(state.model):
            accelerator.backward(loss_fn(batch) / count)
    scaler = accelerator.scaler
    inverse_scale = 1.0 if scaler is None else 1.0 / scaler.get_scale()
    gradient = [
        torch.zeros_like(p) if p.grad is None else p.grad.detach() * inverse_scale
        for p in state.trainable_parameters
    ]
    state.optimizer.zero_grad(set_to_none=True)
    return gradient


def adam_direction(
    gradient: Sequence[Tensor], parameters: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer
) -> list[Tensor]:
    """The bias-corrected Adam direction ``d = m_hat / (sqrt(v_hat) + eps)`` of one Adam step
    on ``gradient`` from ``optimizer``'s current state (appendix K, eq. grad_align_slope):

        m = b1 * m + (1 - b1) * g,    v = b2 * v + (1 - b2) * g^2,    t = step + 1,
        m_hat = m / (1 - b1^t),       v_hat = v / (1 - b2^t),

    with m = v = 0 and step = 0 for parameters Adam has not initialised yet. The step the
    optimizer would take is ``-lr * d`` (plus decoupled weight decay). The optimizer state
    is only read.
    """
    group_of = {p: group for group in optimizer.param_groups for p in group["params"]}
    direction = []
    for p, g in zip(parameters, gradient, strict=True):
        group = group_of[p]
        beta1, beta2 = group["betas"]
        state = optimizer.state.get(p)
        if state:
            m = beta1 * state["exp_avg"] + (1 - beta1) * g
            v = beta2 * state["exp_avg_sq"] + (1 - beta2) * g * g
            t = float(state["step"]) + 1
        else:
            m = (1 - beta1) * g
            v = (1 - beta2) * g * g
            t = 1.0
        m_hat = m / (1 - beta1**t)
        v_hat = v / (1 - beta2**t)
        direction.append(m_hat / (v_hat.sqrt() + group["eps"]))
    return direction


def _parameter_learning_rates(
    parameters: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer
) -> list[float]:
    lr_of = {p: float(group["lr"]) for group in optimizer.param_groups for p in group["params"]}
    return [lr_of[p] for p in parameters]
