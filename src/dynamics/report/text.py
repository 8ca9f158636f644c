"""A plain-text account of one run folder, read from its files only (docs/method.md, "The run folder")."""

from __future__ import annotations

from dynamics.report.lm_eval import lm_eval_table, read_lm_eval
from dynamics.runs.rundir import RunRecords


def _display(value: float, metric: str) -> str:
    # The core stores accuracy as -accuracy (lower is better); show it the human way.
    return f"acc {0.0 - value:.3f}" if metric == "accuracy" else f"{value:.4f}"


def run_report(records: RunRecords) -> str:
    summary = records.summary
    names = records.domain_names
    kinds = dict(zip(names, summary["domain_metrics"], strict=True))
    targets = [names[i] for i in records.targets]
    constraints = [names[i] for i in records.constraints]
    if records.finished:
        lines = [
            f"run: {records.path}",
            f"method: {summary['method']}  ({summary['num_updates']} mixture updates, "
            f"{summary['total_steps']} steps, {summary['train_seconds']:.0f} s training, predicted cost "
            f"{summary['predicted_cost']:.2f}x one fixed run; {summary['cost_assumption']})",
        ]
    else:
        last = records.evaluations[-1]["step"] if records.evaluations else None
        lines = [
            f"run: {records.path} (unfinished: no summary.json yet; still training, or stopped)",
            f"method: {summary['method']}  ({summary['num_updates']} mixture updates so far, "
            f"{'no main evaluation yet' if last is None else f'evaluated up to step {last}'} "
            f"of {summary['total_steps']} steps)",
        ]
    lines += [f"targets: {', '.join(targets)}   constraints: {', '.join(constraints) or 'none'}", ""]
    header = ["step", *[f"{t} (target)" for t in targets], *constraints, "feasible", "weights"]
    rows = []
    for row in records.evaluations:
        weights = " ".join(f"{k}={v:.2f}" for k, v in row["weights"].items())
        rows.append(
            [
                str(row["step"]),
                *[_display(row["eval"][t], kinds[t]) for t in targets],
                *[
                    f"{_display(row['eval'][c], kinds[c])} ({row['constraint_slack'][c]:+.3f})"
                    for c in constraints
                ],
                "no (backtracked)" if row.get("backtracked") else "yes" if row["feasible"] else "no",
                weights,
            ]
        )
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines += ["", "eval split; constraint columns show value (slack = reference - value, >= 0 holds)", ""]
    lines += [f"note: {note}" for note in records.notes]
    if not records.finished:
        return "\n".join(lines).rstrip("\n")
    best = summary["best_checkpoint"]
    if best is None:
        closest = summary.get("closest_to_feasible")
        lines.append("no feasible checkpoint: the base model stays the best choice (reduction 0%).")
        if closest:
            lines.append(
                f"closest to feasible: step {closest['step']}, worst violation {closest['max_violation']:+.4f}"
            )
    else:
        lines.append(
            f"best feasible checkpoint: step {best['step']} ({records.path / best['path']}); "
            f"test perplexity reduction on the targets: {100 * summary['constrained_ppl_reduction']:.1f}%"
        )
    errors = summary.get("mean_abs_prediction_error")
    if errors:
        lines.append(
            "mean |realized - predicted| at the next update: "
            + ", ".join(f"{k} {v:.4f}" for k, v in errors.items())
        )
    harness = read_lm_eval(records.path)
    if harness is not None:
        lines += ["", *lm_eval_table(harness)]
    return "\n".join(lines)
