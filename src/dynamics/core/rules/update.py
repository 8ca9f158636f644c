"""One mixture update with decision rules: the stages of :mod:`dynamics.core.rules.base`
around the paper's grid (eq. 3.4, appendix G), scored on the robust problem."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dynamics.core.problem import MixtureProblem
from dynamics.core.resolution import at_resolution
from dynamics.core.robust import RobustProblem, select_robust
from dynamics.core.rules.base import Measurement, Rule, UpdateStep
from dynamics.core.rules.record import ChoiceRecord, RulesRecord
from dynamics.core.solver import Solution, grid_candidates, solution_of


@dataclass(frozen=True)
class RuledDecision:
    """What an update with rules decided: the solution (its predictions those the rules
    made), and the rules' record."""

    solution: Solution
    record: RulesRecord


def measurement(rules: list[Rule[Any]]) -> Measurement:
    """How the update reads its probes' changes."""
    measured = Measurement()
    for rule in rules:
        measured = rule.measure(measured)
    return measured


def decide(
    rules: list[Rule[Any]], nominal: MixtureProblem, slope_errors: np.ndarray, step: UpdateStep
) -> RuledDecision:
    """The mixture the rules choose for ``nominal``, the problem of eqs. 3.3-3.4 as measured.

    With any rule, differences below an evaluation's resolution are read as none
    (:func:`dynamics.core.resolution.at_resolution`) before the ``tolerate`` stage, so that
    no decision turns on rounding."""
    problem = at_resolution(nominal, step.context.probe_budget, step.questions)
    for rule in rules:
        problem = rule.tolerate(problem, step)
    robust = RobustProblem(problem, slope_errors, probe_budget=step.context.probe_budget)
    for rule in rules:
        robust = rule.shape(robust, step)
    grid = grid_candidates(problem)
    added = [c for rule in rules for c in rule.candidates(robust, step)]
    choice = select_robust(robust, [c.weights for c in grid], added)
    grid_choice = grid[choice.index] if choice.source == "grid" else None
    solution = solution_of(
        problem,
        choice.weights,
        lam=grid_choice.lam if grid_choice is not None else float("nan"),
        eps=grid_choice.eps if grid_choice is not None else 0.0,
        num_candidates=len(grid) + len(added),
        source=choice.source,
    )
    # The predictions the decision was made on: with diminishing returns they are not
    # eq. 3.3's.
    solution = replace(solution, predicted_losses=robust.predicted_losses(choice.weights))
    record = RulesRecord(tuple(rule.record() for rule in rules), ChoiceRecord.of(choice))
    return RuledDecision(solution, record)
