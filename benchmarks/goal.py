"""The goal for a default variant, condition by condition, read from a report of
``benchmarks/beyond_the_paper.py`` (:func:`robustness.aggregate`, benchmarks/robustness.py).

The conditions (the goal for a default of ``benchmarks/results/beyond-the-paper-notebook.md``), per
scenario unless said. Reductions and violations are read on the test split, at the checkpoint chosen
on the eval split; feasibility is read on the eval split (``benchmarks/scenario_families.py`` reads
it on the test split):

- **feasible**: the method keeps every constraint on the eval split in at least 95% of the
  scenario-seeds where some fixed mixture does;
- **nothing feasible**: on the seeds where no fixed mixture keeps every constraint, its
  median violation is at most that of the fixed mixture least violating on eval;
- **equal cost**: its median reduction is at or above the median of the fixed sweep's
  best at equal cost (the eval-best of ``cost`` fixed runs drawn from the sweep), in every
  scenario with a feasible mixture;
- **oracle**: its median is within 3 points of the median of the 8-run oracle (the fixed
  mixture best on eval) over the same seeds, in at least 4 scenarios;
- **targets alone**: where nothing binds (training on the targets alone, ``fixed-w1``,
  kept every constraint on every seed) its median is at most 0.3 points below that run's;
- **cost**: its median wall time is at most 2.5 times the same seed's median fixed run, in
  every scenario.

Sensitivity to machine-sized perturbations is measured by ``benchmarks/sensitivity.py``
and is not read here.

Public API:

- ``scenario_rows(report, method) -> list[ScenarioRow]``: the numbers each condition reads.
- ``goal_conditions(rows) -> list[Condition]``: whether each condition holds.
- ``goal_markdown(report, method) -> str``: both as tables.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from robustness import best_fixed, fixed_results

MIN_FEASIBLE = 0.95
ORACLE_GAP = 0.03
ORACLE_SCENARIOS = 4
TARGETS_ALONE_GAP = 0.003
MAX_COST = 2.5
TARGETS_ALONE = "fixed-w1"


@dataclass(frozen=True)
class ScenarioRow:
    """One scenario's numbers for the goal (reductions and violations on the test split).
    ``None`` where the report does not measure it."""

    scenario: str
    runs: int  # the method's runs on seeds where some fixed mixture is feasible
    feasible: int  # of those, the ones that kept every constraint
    median: float | None  # over those runs
    equal_cost: float | None
    oracle: float | None
    targets_alone: float | None  # only where training on the targets alone kept everything
    cost: float | None
    violation: float | None  # the method's median violation where nothing is feasible
    least_violating: float | None  # the least-violating fixed mixture's


@dataclass(frozen=True)
class Condition:
    name: str
    holds: bool | None  # None: no scenario of the report measures it
    measured: str


def scenario_rows(report: dict[str, Any], method: str) -> list[ScenarioRow]:
    """Per scenario of ``report`` where ``method`` ran, what the goal's conditions read."""
    rows = []
    for scenario, data in report.items():
        summary = data["methods"].get(method)
        if summary is None:
            continue
        # Seeds where some fixed mixture kept every constraint, or that ran without the sweep.
        seeds = [
            by_label
            for by_label in data["runs"].values()
            if method in by_label
            and (
                not fixed_results(by_label)
                or any(run["feasible"] for run in fixed_results(by_label).values())
            )
        ]
        kept = [by_label[method] for by_label in seeds]
        alone = [by_label.get(TARGETS_ALONE) for by_label in seeds]
        nothing_binds = bool(alone) and all(run is not None and run["feasible"] for run in alone)
        # The oracle of the seeds the method ran on, not of every seed of the report.
        best = [
            by_label[best_fixed(fixed_results(by_label))]
            for by_label in seeds
            if fixed_results(by_label)
        ]
        rows.append(
            ScenarioRow(
                scenario=scenario,
                runs=len(kept),
                feasible=sum(run["feasible"] for run in kept),
                median=statistics.median(run["reduction_test"] for run in kept) if kept else None,
                equal_cost=summary.get("median_equal_compute_fixed") if kept else None,
                oracle=statistics.median(run["reduction_test"] for run in best) if best else None,
                targets_alone=statistics.median(run["reduction_test"] for run in alone)
                if nothing_binds
                else None,
                cost=summary.get("median_cost"),
                violation=summary.get("median_violation_nothing_feasible"),
                least_violating=summary.get("median_least_violating_fixed"),
            )
        )
    return rows


def goal_conditions(rows: list[ScenarioRow]) -> list[Condition]:
    """Whether each of the goal's conditions holds over ``rows`` (see the module docstring)."""

    def every(name: str, measured: list[bool], goal: str) -> Condition:
        """Holds in every scenario that measures it (one entry each)."""
        if not measured:
            return Condition(name, None, "not measured")
        met = sum(measured)
        return Condition(name, met == len(measured), f"{met} of {len(measured)} scenarios ({goal})")

    runs, feasible = sum(r.runs for r in rows), sum(r.feasible for r in rows)
    oracle = [
        r.median >= r.oracle - ORACLE_GAP
        for r in rows
        if r.median is not None and r.oracle is not None
    ]
    met = sum(oracle)
    return [
        Condition(
            "feasible",
            feasible >= MIN_FEASIBLE * runs if runs else None,
            f"{feasible} of {runs} runs (goal: {100 * MIN_FEASIBLE:.0f}%)"
            if runs
            else "not measured",
        ),
        every(
            "nothing feasible",
            [
                r.violation <= r.least_violating
                for r in rows
                if r.violation is not None and r.least_violating is not None
            ],
            "goal: median violation at most the least-violating fixed mixture's",
        ),
        every(
            "equal cost",
            [
                r.median >= r.equal_cost
                for r in rows
                if r.median is not None and r.equal_cost is not None
            ],
            "goal: every scenario",
        ),
        Condition(
            "oracle",
            met >= ORACLE_SCENARIOS if oracle else None,
            f"{met} of {len(oracle)} scenarios within {100 * ORACLE_GAP:.0f} points (goal: "
            f"{ORACLE_SCENARIOS})"
            if oracle
            else "not measured",
        ),
        every(
            "targets alone",
            [
                r.median >= r.targets_alone - TARGETS_ALONE_GAP
                for r in rows
                if r.median is not None and r.targets_alone is not None
            ],
            f"goal: within {100 * TARGETS_ALONE_GAP:.1f} points where nothing binds",
        ),
        every(
            "cost",
            [r.cost <= MAX_COST for r in rows if r.cost is not None],
            f"goal: at most {MAX_COST}x",
        ),
    ]


def goal_markdown(report: dict[str, Any], method: str) -> str:
    """The per-scenario numbers and the conditions, as two markdown tables."""
    rows = scenario_rows(report, method)
    if not rows:
        return f"`{method}` has no runs in this report."

    def percent(x: float | None) -> str:
        return "" if x is None else f"{100 * x:.1f}%"

    lines = [
        f"The goal for `{method}` (test split, medians over seeds):",
        "",
        "| scenario | feasible | median | fixed sweep at equal cost | 8-run oracle | to the oracle "
        "| targets alone | cost | violation where nothing is feasible |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gap = "" if r.median is None or r.oracle is None else f"{100 * (r.median - r.oracle):+.1f}"
        violation = (
            "" if r.violation is None else f"{r.violation:.4f} (fixed: {r.least_violating:.4f})"
        )
        lines.append(
            f"| `{r.scenario}` | "
            f"{f'{r.feasible} of {r.runs}' if r.runs else 'no feasible mixture'} | "
            f"{percent(r.median)} | {percent(r.equal_cost)} "
            f"| {percent(r.oracle)} | {gap} | {percent(r.targets_alone)} "
            f"| {'' if r.cost is None else f'{r.cost:.2f}x'} | {violation} |"
        )
    lines += ["", "| condition | holds | measured |", "|---|---|---|"]
    for c in goal_conditions(rows):
        holds = {True: "yes", False: "no", None: "not measured"}[c.holds]
        lines.append(f"| {c.name} | {holds} | {c.measured} |")
    return "\n".join(lines)
