"""Mixture policies behind one interface (``controller.MixturePolicy``).

- :class:`DynamicsPolicy`: the paper's method, Algorithm 1 (probing) + eq. 3.3/3.4.
- :class:`FixedWeightsPolicy`: one mixture for the whole run (section 4.4 baselines;
  :mod:`dynamics.core.fixed_mixtures` generates the paper's sweep of them).
- :class:`GradientAlignmentPolicy`: slopes from gradient dot products (appendix K),
  supplied by an :class:`~dynamics.core.learner.AlignmentLearner`, solved the same way.

Each policy holds the run's :class:`~dynamics.core.shares.MixtureUnit`: the solvers find
batch shares (the unit of the slopes, and of ``min_weight`` and the floors), and a record's
``weights`` are those batch shares in the run's unit, the weights the sampler is given.
Under token shares the record also keeps the batch shares its predictions assume, as
``batch_shares``; a fixed policy's weights are the user's, in the run's unit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dynamics.core.decisions import slope_standard_errors
from dynamics.core.learner import AlignmentLearner, Diverged, Learner
from dynamics.core.policy_interface import UpdateContext
from dynamics.core.predictors import PREDICTORS, probe_progress
from dynamics.core.probes import measured_changes, probe_datasets
from dynamics.core.problem import MixtureProblem, SolverGrid
from dynamics.core.records import UpdateRecord
from dynamics.core.rules import Rule, RuleSet, UpdateStep
from dynamics.core.rules.update import decide as ruled_update
from dynamics.core.rules.update import measurement
from dynamics.core.schedules import UpdateSchedule, build_schedule
from dynamics.core.shares import BatchShares, MixtureUnit
from dynamics.core.solver import Solution, solve

if TYPE_CHECKING:  # the registry imports the policies
    from dynamics.core.policy_registry import PolicySettings


def _solve_update(
    name: str,
    context: UpdateContext,
    slope_matrix: np.ndarray,
    grid: SolverGrid,
    probe_seconds: float,
    extra: dict | None = None,
    min_weight: float = 0.0,
) -> UpdateRecord:
    """Eq. 3.3 + 3.4 on the given slopes, as an update record."""
    problem = _problem_at(context, slope_matrix, grid, min_weight)
    return _update_record(name, context, problem, solve(problem), probe_seconds, extra or {})


def _problem_at(
    context: UpdateContext, slope_matrix: np.ndarray, grid: SolverGrid, min_weight: float = 0.0
) -> MixtureProblem:
    """The mixture problem of eqs. 3.3-3.4 at the update described by ``context``, every
    weight held at or above ``min_weight``."""
    return MixtureProblem(
        slopes=slope_matrix,
        current_losses=context.anchor.means(),
        reference_losses=context.reference_losses,
        targets=context.targets,
        constraints=context.constraints,
        horizon=context.horizon,
        grid=grid,
        min_weight=min_weight,
    )


def _update_record(
    name: str,
    context: UpdateContext,
    problem: MixtureProblem,
    solution: Solution,
    probe_seconds: float,
    extra: dict,
) -> UpdateRecord:
    """The record of one update; ``current_losses`` are the measured anchor's."""
    return UpdateRecord(
        policy=name,
        step=context.step,
        horizon=context.horizon,
        probe_budget=context.probe_budget,
        weights=np.asarray(solution.weights, dtype=float),
        current_losses=problem.current_losses,
        recycled_anchor=context.recycled_anchor,
        slope_matrix=problem.slopes,
        predicted_losses=np.asarray(solution.predicted_losses, dtype=float),
        solver=solution.to_dict(),
        probe_seconds=probe_seconds,
        **extra,
    )


def _in_unit(record: UpdateRecord, unit: MixtureUnit) -> UpdateRecord:
    """``record``, whose weights are the batch shares it solved, with its weights in ``unit``."""
    batch_shares = np.asarray(record.weights, dtype=float)
    record.weights = unit.weights_of(batch_shares)
    record.batch_shares = _kept_batch_shares(unit, batch_shares)
    return record


def _kept_batch_shares(unit: MixtureUnit, batch_shares: np.ndarray) -> np.ndarray | None:
    """The batch shares a record keeps beside its weights: none where the weights are them."""
    return None if unit.name == BatchShares.name else np.asarray(batch_shares, dtype=float)


def _widen(record: UpdateRecord, columns: list[int], num_datasets: int) -> None:
    """Put a record solved over ``columns`` of the datasets back on all of them: weight 0
    and NaN slopes (and slope errors) for the datasets left out."""
    weights = np.zeros(num_datasets)
    weights[columns] = record.weights
    record.weights = weights
    if record.slope_matrix is not None:
        slopes = np.full((record.slope_matrix.shape[0], num_datasets), np.nan)
        slopes[:, columns] = record.slope_matrix
        record.slope_matrix = slopes
    errors = record.slope_errors
    if errors is not None:
        widened = np.full((errors.shape[0], num_datasets), np.nan)
        widened[:, columns] = errors
        record.slope_errors = widened
    for key in ("slope_models", "extrapolation_guarded"):
        if getattr(record, key) is not None:
            placed = [dict(zip(columns, row, strict=True)) for row in getattr(record, key)]
            setattr(
                record,
                key,
                [[by_column.get(j) for j in range(num_datasets)] for by_column in placed],
            )


@dataclass
class DynamicsPolicy:
    """DynaMiCS: probe each dataset from the same snapshot, predict, solve (section 3).

    predictor: "linear" (eq. 3.3, one evaluation per probe) or "curve" (appendix J,
    evaluations at several points of each probe and a fitted curve per entry).
    rules:     decision rules beyond the paper (:mod:`dynamics.core.rules`); none is the
    paper's method. Every update records the slopes' standard errors either way.
    min_weight: the least batch share of every dataset the update solves over
    (``method.floors.all``).
    A dataset whose probe diverged is left out of that update with weight 0, floor or not:
    training on it gave non-finite losses.
    unit:      what the recorded weights are shares of (:mod:`dynamics.core.shares`).
    """

    schedule: UpdateSchedule
    predictor: str = "linear"
    grid: SolverGrid = field(default_factory=SolverGrid)
    name: str = "dynamics"
    rules: RuleSet = field(default_factory=RuleSet)
    min_weight: float = 0.0
    unit: MixtureUnit = field(default_factory=BatchShares)
    _rules: list[Rule[Any]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._rules = self.rules.build()
        if self.predictor not in PREDICTORS:
            raise ValueError(
                f"unknown predictor {self.predictor!r}: use one of {sorted(PREDICTORS)}"
            )

    @classmethod
    def from_settings(cls, settings: PolicySettings) -> DynamicsPolicy:
        return cls(
            _schedule_of(settings),
            predictor=settings.predictor,
            grid=settings.grid,
            rules=settings.rules,
            min_weight=settings.min_weight,
            unit=settings.unit,
        )

    def decide(self, learner: Learner, context: UpdateContext) -> UpdateRecord:
        started = time.perf_counter()
        predictor = PREDICTORS[self.predictor]
        budget = context.probe_budget
        # Probe checkpoints (in steps from the snapshot); the last one is always c_t.
        checkpoints = probe_progress(budget, predictor.num_probe_evals)
        num_datasets = len(learner.dataset_names)
        probes = probe_datasets(learner, checkpoints, context.reduced_batches)
        reliable = probes.reliable()
        if not reliable:
            raise Diverged(
                f"every probe at step {context.step} reached a non-finite loss or evaluation: "
                "lower optimizer.lr or set optimizer.max_grad_norm, and start again"
            )
        # A diverged probe says nothing about its dataset: its column is left out of this
        # update (weight 0), and the record says so. Trajectories are (K, M, N).
        kinds = context.domain_kinds
        base, probed, accuracy_slopes = measured_changes(
            context.anchor, probes, reliable, kinds, measurement(self._rules).expected_accuracy
        )
        fit = predictor.slopes(
            anchor=base.mean(axis=1),
            checkpoints=np.asarray(checkpoints),
            trajectories=probed.mean(axis=-1).transpose(1, 2, 0),
            probe_budget=budget,
            horizon=context.horizon,
        )
        # An expected accuracy moves continuously: its spread needs no binomial floor.
        floored = None if accuracy_slopes == "expected" else kinds
        slope_errors = slope_standard_errors(base, probed[:, -1], budget, floored)
        extra = {"predictor": self.predictor, **fit.details, "slope_errors": slope_errors}
        if accuracy_slopes is not None:
            extra["accuracy_slopes"] = accuracy_slopes
        probe_seconds = time.perf_counter() - started
        if self.rules.is_paper:
            record = _solve_update(
                self.name,
                context,
                fit.slope_matrix,
                self.grid,
                probe_seconds,
                extra,
                self.min_weight,
            )
        else:
            record = self._ruled_update(
                context,
                fit.slope_matrix,
                slope_errors,
                probe_seconds,
                extra,
                target_datasets=[
                    k
                    for k, j in enumerate(reliable)
                    if learner.dataset_names[j] in _target_names(learner, context)
                ],
            )
        record.dataset_probe_seconds = probes.seconds
        record.probe_ranks = probes.ranks
        if len(reliable) < num_datasets:
            _widen(record, reliable, num_datasets)
            record.unreliable_datasets = [
                learner.dataset_names[j] for j in range(num_datasets) if j not in reliable
            ]
        return _in_unit(record, self.unit)

    def state_dict(self) -> dict[str, Any]:
        return {}  # every update decides from its own probes: the rules carry nothing over

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def _ruled_update(
        self,
        context: UpdateContext,
        slope_matrix: np.ndarray,
        slope_errors: np.ndarray,
        probe_seconds: float,
        extra: dict,
        target_datasets: list[int],
    ) -> UpdateRecord:
        """The update with the decision rules of :mod:`dynamics.core.rules`.
        ``target_datasets`` are the columns of the probed datasets that are also target
        domains."""
        nominal = _problem_at(context, slope_matrix, self.grid, self.min_weight)
        step = UpdateStep(
            context=context,
            target_datasets=target_datasets,
            questions=[
                context.reduced_batches * k.batch_size if k.metric == "accuracy" else 0
                for k in context.domain_kinds
            ],
            accuracy_slopes=extra.get("accuracy_slopes"),
            extra=extra,
        )
        decision = ruled_update(self._rules, nominal, slope_errors, step)
        record = _update_record(
            self.name, context, nominal, decision.solution, probe_seconds, extra
        )
        record.rules = decision.record
        return record


def _target_names(learner: Learner, context: UpdateContext) -> set[str]:
    """Names of the target domains: a fine-tuning dataset of the same name is target data."""
    return {learner.domain_names[i] for i in context.targets}


@dataclass
class FixedWeightsPolicy:
    """One mixture for the whole run: a single update at step 0, no probing. ``weights``
    are in the run's ``unit`` (token shares under ``training.sampling: tokens``)."""

    weights: np.ndarray
    total_steps: int
    label: str = "fixed"
    unit: MixtureUnit = field(default_factory=BatchShares)

    def __post_init__(self) -> None:
        w = np.asarray(self.weights, dtype=float)
        if w.ndim != 1 or w.size == 0 or np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
            raise ValueError(
                "fixed weights must be non-negative numbers with a positive sum, got "
                f"{self.weights}"
            )
        self.weights = w / w.sum()

    @classmethod
    def from_settings(cls, settings: PolicySettings) -> FixedWeightsPolicy:
        if not settings.weights:
            raise ValueError("method.weights: the fixed method needs a weight per training dataset")
        weights = np.array([settings.weights[name] for name in settings.dataset_names], dtype=float)
        _check_fixed_floor(weights, settings)
        return cls(weights, total_steps=settings.total_steps, label="fixed", unit=settings.unit)

    @property
    def name(self) -> str:
        return self.label

    @property
    def schedule(self) -> UpdateSchedule:
        return build_schedule([0], self.total_steps)

    def decide(self, learner: Learner, context: UpdateContext) -> UpdateRecord:
        if len(self.weights) != len(learner.dataset_names):
            raise ValueError(
                f"fixed weights have {len(self.weights)} entries but there are "
                f"{len(learner.dataset_names)} fine-tuning datasets"
            )
        return UpdateRecord(
            policy=self.name,
            step=context.step,
            horizon=context.horizon,
            probe_budget=0,
            weights=self.weights.copy(),
            current_losses=context.anchor.means(),
            recycled_anchor=context.recycled_anchor,
            batch_shares=_kept_batch_shares(self.unit, self.unit.batch_shares(self.weights)),
        )

    def state_dict(self) -> dict[str, Any]:
        return {}  # one mixture, nothing carried between updates

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@dataclass
class GradientAlignmentPolicy:
    """Slopes S_ij = -lr <g_i, d_j> from the learner (appendix K), then eq. 3.4 with every
    batch share at or above ``min_weight``, recorded in ``unit``."""

    schedule: UpdateSchedule
    num_batches: int = 200
    grid: SolverGrid = field(default_factory=SolverGrid)
    name: str = "gradient-alignment"
    min_weight: float = 0.0
    unit: MixtureUnit = field(default_factory=BatchShares)

    @classmethod
    def from_settings(cls, settings: PolicySettings) -> GradientAlignmentPolicy:
        return cls(
            _schedule_of(settings),
            num_batches=settings.alignment_batches,
            grid=settings.grid,
            min_weight=settings.min_weight,
            unit=settings.unit,
        )

    def decide(self, learner: Learner, context: UpdateContext) -> UpdateRecord:
        if not isinstance(learner, AlignmentLearner):
            raise TypeError("gradient alignment needs a learner with alignment_slopes()")
        started = time.perf_counter()
        slope_matrix = np.asarray(learner.alignment_slopes(self.num_batches), dtype=float)
        record = _solve_update(
            self.name,
            context,
            slope_matrix,
            self.grid,
            probe_seconds=time.perf_counter() - started,
            min_weight=self.min_weight,
        )
        return _in_unit(record, self.unit)

    def state_dict(self) -> dict[str, Any]:
        return {}  # every update starts from the learner's gradients alone

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _schedule_of(settings: PolicySettings) -> UpdateSchedule:
    return build_schedule(
        settings.schedule, settings.total_steps, settings.probe_cap, settings.probe_min
    )


def _check_fixed_floor(weights: np.ndarray, settings: PolicySettings) -> None:
    """``method.floors.all`` is a share of batches: fixed token shares must draw at least that
    share of the batches from every dataset. (The config refuses what it can see alone, fixed
    batch shares below the floor.)"""
    floor, unit = settings.min_weight, settings.unit
    batch_shares = unit.batch_shares(weights / weights.sum())
    below = {
        name: round(float(b), 4)
        for name, b in zip(settings.dataset_names, batch_shares, strict=True)
        if b < floor - 1e-12
    }
    if below:
        raise ValueError(
            f"method.weights draw {below} of the batches under training.sampling: {unit.name}, "
            f"less than method.floors.all ({floor:g}), a share of batches: raise their weights "
            "or lower method.floors.all"
        )
