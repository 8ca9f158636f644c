"""Compare a DynaMiCS run with a sweep of fixed-mixture runs, from their run folders only.

Used by ``dynamics demo``; works on any set of folders written by ``dynamics run`` over
the same datasets and domains. Produces the comparison table and a Markdown report with
plots (matplotlib, Agg backend):

- weights over steps (DynaMiCS);
- each constraint's value against its reference over steps (DynaMiCS and the best fixed run);
- target loss over steps (DynaMiCS and every fixed run);
- perplexity reduction against cost: DynaMiCS at its counted cost against the best@k curve
  of the fixed runs (k runs cost k; paper section 4.5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dynamics.core import metrics
from dynamics.report.plotting import plot_weights, pyplot, save
from dynamics.runs.rundir import RunRecords


@dataclass(frozen=True)
class MethodRow:
    """One line of the comparison table."""

    label: str
    feasible: bool
    ppl_reduction: float  # test split, best feasible checkpoint chosen on eval; 0 if infeasible
    best_step: int | None
    worst_slack: float  # min over constraints of (reference - value) at the reported checkpoint
    wall_seconds: float  # training loop only (probes and evaluations included, setup not)
    cost: float  # the cost model's count: forward passes over one fixed run's (summary.json)
    wall_ratio: float  # wall time over the median fixed run's: depends on the machine's load

    def cells(self) -> list[str]:
        return [
            self.label,
            "yes" if self.feasible else "no",
            f"{100 * self.ppl_reduction:.1f}%",
            "-" if self.best_step is None else str(self.best_step),
            f"{self.worst_slack:+.4f}",
            f"{self.cost:.2f}x",
            f"{self.wall_seconds:.0f} s ({self.wall_ratio:.2f}x)",
        ]


HEADER = [
    "method",
    "feasible",
    "target PPL reduction (test)",
    "checkpoint",
    "worst slack",
    "cost",
    "wall time",
]


def method_row(label: str, records: RunRecords, unit_seconds: float) -> MethodRow:
    points = records.eval_points()
    targets, constraints = records.targets, records.constraints
    margin = records.selection_margin
    best = metrics.best_feasible_checkpoint(points, targets, constraints, margin)
    if best is not None:
        reported = best
    elif len(points) > 1 and constraints:
        step, _ = metrics.max_violation_closest_to_feasibility(points, constraints)
        reported = next(p for p in points if p.step == step)
    else:
        reported = points[-1]
    slack = (
        metrics.constraint_slack(reported, points[0], constraints) if constraints else np.zeros(1)
    )
    wall = float(records.summary["train_seconds"])
    return MethodRow(
        label=label,
        feasible=best is not None,
        ppl_reduction=metrics.constrained_perplexity_reduction(
            points, targets, constraints, margin
        ),
        best_step=None if best is None else best.step,
        worst_slack=float(slack.min()),
        wall_seconds=wall,
        cost=float(records.summary["predicted_cost"]),
        wall_ratio=wall / unit_seconds,
    )


def markdown_table(rows: Sequence[MethodRow]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def text_table(rows: Sequence[MethodRow]) -> str:
    table = [HEADER, *[row.cells() for row in rows]]
    widths = [max(len(r[k]) for r in table) for k in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table)


def best_at_k_curve(fixed_rows: Sequence[MethodRow]) -> list[tuple[int, float]]:
    """(k, expected best-of-k PPL reduction) for k = 1..len(pool), sampling with replacement."""
    pool = [row.ppl_reduction for row in fixed_rows]
    return [(k, metrics.best_at_k(pool, k)) for k in range(1, len(pool) + 1)]


def _display(values: np.ndarray, metric: str) -> np.ndarray:
    return -values if metric == "accuracy" else values


def write_plots(
    folder: Path,
    dynamics: RunRecords,
    fixed: dict[str, RunRecords],
    best_fixed_label: str | None,
    dynamics_row: MethodRow,
    fixed_rows: Sequence[MethodRow],
) -> dict[str, str]:
    """Write the four figures as PNG into ``folder``; returns {name: file name}."""
    plt = pyplot()
    files: dict[str, str] = {}
    names = dynamics.domain_names
    kinds = dynamics.summary["domain_metrics"]

    # 1. Weights over steps: piecewise constant between updates.
    fig, ax = plt.subplots(figsize=(7, 3.5))
    plot_weights(ax, dynamics)
    ax.set(xlabel="training step", ylabel="mixture weight", title="DynaMiCS weights")
    ax.legend(fontsize=8, loc="best")
    files["weights"] = save(fig, folder, "weights.png")

    # 2. Constraints against their reference.
    constraints = dynamics.constraints
    fig, axes = plt.subplots(
        1, max(1, len(constraints)), figsize=(3.6 * max(1, len(constraints)), 3.3)
    )
    axes = np.atleast_1d(axes)
    runs = [("DynaMiCS", dynamics)]
    if best_fixed_label is not None:
        runs.append((f"best fixed ({best_fixed_label})", fixed[best_fixed_label]))
    for ax, i in zip(axes, constraints, strict=False):
        for label, records in runs:
            points = records.eval_points()
            ax.plot(
                [p.step for p in points],
                _display(np.array([p.eval[i] for p in points]), kinds[i]),
                marker=".",
                label=label,
            )
        reference = _display(np.array([dynamics.eval_points()[0].eval[i]]), kinds[i])[0]
        ax.axhline(
            reference, color="black", linestyle="--", linewidth=1, label="reference (step 0)"
        )
        better = "higher" if kinds[i] == "accuracy" else "lower"
        ax.set(xlabel="step", ylabel=f"{kinds[i]} ({better} is better)", title=names[i])
    axes[0].legend(fontsize=7)
    files["constraints"] = save(fig, folder, "constraints.png")

    # 3. Target loss (mean over targets) over steps.
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for label, records in [("DynaMiCS", dynamics), *fixed.items()]:
        points = records.eval_points()
        values = [float(np.mean(p.eval[records.targets])) for p in points]
        style = (
            {"linewidth": 2.5, "color": "black"}
            if label == "DynaMiCS"
            else {"linewidth": 1, "alpha": 0.7}
        )
        ax.plot([p.step for p in points], values, label=label, **style)
    ax.set(xlabel="step", ylabel="mean target loss (nats, eval)", title="Target loss")
    ax.legend(fontsize=6, ncol=2)
    files["targets"] = save(fig, folder, "targets.png")

    # 4. PPL reduction against cost.
    fig, ax = plt.subplots(figsize=(6, 3.8))
    curve = best_at_k_curve(fixed_rows)
    ax.plot(
        [k for k, _ in curve],
        [100 * v for _, v in curve],
        marker="*",
        label="fixed mixtures: best@k",
    )
    ax.scatter(
        [dynamics_row.cost],
        [100 * dynamics_row.ppl_reduction],
        color="red",
        s=60,
        zorder=3,
        label="DynaMiCS (one run)",
    )
    ax.set(
        xlabel="cost (multiples of one fixed run)",
        ylabel="constrained PPL reduction (%)",
        title="Reduction against cost",
    )
    ax.legend(fontsize=8)
    files["cost"] = save(fig, folder, "cost.png")
    return files
