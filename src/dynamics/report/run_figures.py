"""One run's figures and numbers, from its run folder only (``dynamics report RUN_DIR --out``):

- the mixture weights over steps (piecewise constant between updates);
- every evaluation domain's value over steps against its step-0 reference;
- each constraint's slack (reference - value) over steps;
- at every update, the value it predicted for the next update against the value realized.

Accuracy domains are stored as -accuracy (lower is better); the figures show accuracy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dynamics.report.plotting import plot_weights, pyplot, save
from dynamics.runs.rundir import RunRecords


def shown(value: float, metric: str) -> float:
    """A stored value as people read it: accuracy for accuracy domains, loss otherwise."""
    return -value if metric == "accuracy" else value


def run_numbers(records: RunRecords) -> dict[str, Any]:
    """The series the figures draw, as plain data (``report.json``); values as shown."""
    names = records.domain_names
    kinds = dict(zip(names, records.summary["domain_metrics"], strict=True))
    kept = records.kept_evaluations
    constraints = [names[i] for i in records.constraints]
    updates = []
    for update in records.updates:
        predicted, realized = update.predicted_losses, update.realized_losses
        updates.append(
            {
                "step": update.step,
                "horizon": update.horizon,
                "weights": dict(
                    zip(records.dataset_names, map(float, update.weights), strict=True)
                ),
                "predicted": None
                if predicted is None
                else {n: shown(float(v), kinds[n]) for n, v in zip(names, predicted, strict=True)},
                "realized": None
                if realized is None
                else {n: shown(float(v), kinds[n]) for n, v in zip(names, realized, strict=True)},
            }
        )
    return {
        "path": str(records.path),
        "method": records.summary["method"],
        "policy": records.summary["policy"],
        "feasible": records.summary["feasible"],
        "constrained_ppl_reduction": records.summary["constrained_ppl_reduction"],
        "best_checkpoint_step": None
        if records.best_checkpoint is None
        else records.best_checkpoint.step,
        "closest_to_feasible": records.summary.get("closest_to_feasible"),
        "predicted_cost": records.summary["predicted_cost"],
        "train_seconds": records.summary["train_seconds"],
        "domains": {
            n: {"metric": kinds[n], "role": "target" if i in records.targets else "constraint"}
            for i, n in enumerate(names)
        },
        "steps": [line.step for line in kept],
        "eval": {n: [shown(line.eval[n], kinds[n]) for line in kept] for n in names},
        "test": {n: [shown(line.test[n], kinds[n]) for line in kept] for n in names},
        "constraint_slack": {c: [line.constraint_slack[c] for line in kept] for c in constraints},
        "updates": updates,
    }


def write_run_figures(records: RunRecords, folder: Path) -> dict[str, str]:
    """Write the run's PNGs into ``folder``; returns {figure: file name} (``predictions`` only
    when the run predicted anything: fixed weights do not)."""
    plt = pyplot()
    numbers = run_numbers(records)
    names = records.domain_names
    kinds = numbers["domains"]
    steps = numbers["steps"]
    files: dict[str, str] = {}

    fig, ax = plt.subplots(figsize=(7, 3.5))
    plot_weights(ax, records)
    ax.set(
        xlabel="training step",
        ylabel="mixture weight",
        title=f"Mixture weights ({numbers['policy']})",
    )
    ax.legend(fontsize=8)
    files["weights"] = save(fig, folder, "weights.png")

    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.8 * cols, 3.0 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        metric = kinds[name]["metric"]
        ax.plot(steps, numbers["eval"][name], marker=".", label="eval split")
        ax.plot(steps, numbers["test"][name], marker=".", alpha=0.6, label="test split")
        ax.axhline(
            numbers["eval"][name][0],
            color="black",
            linestyle="--",
            linewidth=1,
            label="step 0 (eval)",
        )
        better = "higher" if metric == "accuracy" else "lower"
        ax.set(
            title=f"{name} ({kinds[name]['role']})",
            xlabel="step",
            ylabel=f"{metric} ({better} is better)",
        )
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    files["losses"] = save(fig, folder, "losses.png")

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, slack in numbers["constraint_slack"].items():
        ax.plot(steps, slack, marker=".", label=f"{name} ({kinds[name]['metric']})")
    ax.axhline(0.0, color="black", linewidth=1)
    ax.set(
        xlabel="step",
        ylabel="slack = reference - value",
        title="Constraint slack (eval split; >= 0 holds)",
    )
    if numbers["constraint_slack"]:
        ax.legend(fontsize=8)
    files["slack"] = save(fig, folder, "slack.png")

    predicted = [
        u for u in numbers["updates"] if u["predicted"] is not None and u["realized"] is not None
    ]
    if predicted:
        fig, axes = plt.subplots(rows, cols, figsize=(3.8 * cols, 3.0 * rows), squeeze=False)
        for ax, name in zip(axes.flat, names, strict=False):
            x = [u["step"] for u in predicted]
            ax.plot(
                x, [u["predicted"][name] for u in predicted], "o", mfc="none", label="predicted"
            )
            ax.plot(x, [u["realized"][name] for u in predicted], "x", label="realized")
            ax.set(
                title=name,
                xlabel="update step (value at the next update)",
                ylabel=kinds[name]["metric"],
            )
            if max(x) >= 16:  # geometric schedules: updates crowd the early steps
                ax.set_xscale("symlog", linthresh=1)
        for ax in list(axes.flat)[len(names) :]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7)
        files["predictions"] = save(fig, folder, "predictions.png")
    return files
