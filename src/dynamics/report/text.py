"""A plain-text account of one run folder, read from its files only (docs/method.md, "The run
folder")."""

from __future__ import annotations

import numpy as np

from dynamics.core import metrics
from dynamics.core.records import UpdateRecord
from dynamics.core.rules.target_floor import TargetFloorParams
from dynamics.report.lm_eval import lm_eval_table, read_lm_eval
from dynamics.runs.rundir import RunRecords

CLEAR_BY = 2.0
"""Standard errors of its change a constraint's eval slack should clear before the report
calls it held with room."""


def _display(value: float, metric: str) -> str:
    # The core stores accuracy as -accuracy (lower is better); show it the human way.
    return f"acc {0.0 - value:.3f}" if metric == "accuracy" else f"{value:.4f}"


def _predicted_feasible(update: UpdateRecord) -> bool | None:
    """Whether the update found a mixture predicted to keep every constraint (the rules' own
    verdict where they decided), or None where no solver decided."""
    if update.rules is not None:
        return update.rules.choice.feasible
    solver = update.solver
    return None if solver is None else bool(solver["feasible"])


def target_data_lines(records: RunRecords) -> list[str]:
    """How much of the run trained on target data (datasets named like a target domain),
    the stretch at its end without any, and the updates where no mixture was predicted to
    keep every constraint. Then a hint toward ``method.floors.targets`` where all of these hold:
    some update predicted no mixture feasible, the run's last quarter or more trained no
    target data, some checkpoint kept every constraint, and the floor is off. Updates a
    backtrack abandoned are left out, and each update counts until the next one kept, or
    the run's end. Empty for a run whose mixture no solver decided (a fixed mixture) or
    without target data."""
    updates = [u for u in records.kept_updates if _predicted_feasible(u) is not None]
    targets = {records.domain_names[i] for i in records.targets}
    columns = [j for j, name in enumerate(records.dataset_names) if name in targets]
    total = int(records.summary["total_steps"])
    if not updates or not columns:
        return []
    starts = [u.step for u in updates]
    ends = [*starts[1:], total]
    steps = [
        min(u.horizon, end - start) for u, start, end in zip(updates, starts, ends, strict=True)
    ]
    shares = [sum(float(u.trained_shares[j]) for j in columns) for u in updates]
    trained = {
        j: sum(float(u.trained_shares[j]) * n for u, n in zip(updates, steps, strict=True))
        for j in columns
    }
    per_dataset = ", ".join(
        f"{records.dataset_names[j]} {100 * trained[j] / total:.1f}%" for j in columns
    )
    share = 100 * sum(trained.values()) / total
    line = f"target data: {share:.1f}% of the {total} steps ({per_dataset})"
    # The first update from which no update trained target data (the run's end if none).
    dry_from = next(
        (starts[k] for k in range(len(updates)) if all(s <= 1e-6 for s in shares[k:])), total
    )
    dry = total - dry_from
    if dry:
        line += f"; none from step {dry_from} to the end ({dry} steps)"
    lines = [line]
    if not records.constraints:
        return lines
    infeasible = [
        start for u, start in zip(updates, starts, strict=True) if not _predicted_feasible(u)
    ]
    if infeasible:
        lines.append(
            f"no mixture was predicted to keep every constraint at {len(infeasible)} of "
            f"{len(updates)} updates "
            f"(steps {', '.join(map(str, infeasible))}): each trained the mixture predicted to "
            f"break them least"
        )
    last = updates[-1].rules
    floor = 0.0 if last is None else last.find(TargetFloorParams).target_floor
    # Only where some checkpoint kept every constraint: where none did, target data is
    # what breaks them more.
    kept = records.best_checkpoint is not None
    if infeasible and 4 * dry >= total and not floor and kept:
        lines.append(
            "hint: if a small share of target data can keep the constraints, "
            "method.floors.targets: 0.02 keeps "
            "2% on each target in such updates (measured with answer_tolerance: 0.5 in "
            "benchmarks/results/beyond-the-paper-notebook.md: "
            "more learned where some mixture kept the constraints, more violation where none could)"
        )
    return lines


def margin_lines(records: RunRecords, step: int) -> list[str]:
    """How far each constraint of the checkpoint at ``step`` clears its reference on the eval
    split, in standard errors of its change measured batch by batch, and a note where one
    clears it by less than ``CLEAR_BY``: on data the checkpoint was not chosen on, such a
    constraint can read as broken. Empty for a run without per-batch values."""
    points = records.eval_points()
    point = next((p for p in points if p.step == step), None)
    if (
        point is None
        or point.eval_batches is None
        or points[0].eval_batches is None
        or point.eval_batches.shape[1] < 2
    ):
        return []
    constraints = records.constraints
    slack = metrics.constraint_slack(point, points[0], constraints)
    error = metrics.change_standard_error(point, points[0])[constraints]
    names = [records.domain_names[c] for c in constraints]
    parts, close = [], []
    for name, s, e in zip(names, slack, error, strict=True):
        if e > 0:
            parts.append(f"{name} {s:+.4f} ({s / e:+.1f} errors)")
            if s / e < CLEAR_BY:
                close.append(name)
        else:
            parts.append(f"{name} {s:+.4f} (unchanged on every batch)")
    lines = ["its slack on the eval split, in standard errors of the change: " + ", ".join(parts)]
    if close:
        batches = point.eval_batches.shape[1]
        lines.append(
            f"note: {', '.join(close)} {'holds' if len(close) == 1 else 'hold'} by less than "
            f"{CLEAR_BY:g} errors "
            f"of {batches} eval batches: data the checkpoint was not chosen on may show "
            f"{'it' if len(close) == 1 else 'them'} broken; more evaluation.batches narrow the "
            f"error (4x the "
            f"batches halve it)"
        )
    return lines


def update_lines(records: RunRecords) -> list[str]:
    """One line per mixture update: its step, horizon and weights, and every field of the
    update record that names a report column (``UpdateRecord.report_columns``). Updates a
    backtrack abandoned say so."""
    if not records.updates:
        return []
    columns = UpdateRecord.report_columns()
    header = ["update", "horizon", *[title for title, _ in columns], "weights"]
    rows = [
        [
            f"{u.step}{' (abandoned)' if u.abandoned else ''}",
            str(u.horizon),
            *[_cell(getattr(u, name)) for _, name in columns],
            " ".join(
                f"{n}={float(w):.2f}" for n, w in zip(records.dataset_names, u.weights, strict=True)
            ),
        ]
        for u in records.updates
    ]
    return _table(header, rows)


def _cell(value: object) -> str:
    """A recorded value as a table cell: numbers to 4 significant digits, arrays and lists
    spaced, "-" where the update has none."""
    if value is None:
        return "-"
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, int | float):
        return f"{value:.4g}"
    if isinstance(value, np.ndarray | list | tuple):
        return " ".join(_cell(v.item() if isinstance(v, np.generic) else v) for v in value)
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]


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
            f"{summary['total_steps']} steps, {summary['train_seconds']:.0f} s training, predicted "
            f"cost "
            f"{summary['predicted_cost']:.2f}x one fixed run; {summary['cost_assumption']})",
        ]
    else:
        last = records.evaluations[-1].step if records.evaluations else None
        lines = [
            f"run: {records.path} (unfinished: no summary.json yet; still training, or stopped)",
            f"method: {summary['method']}  ({summary['num_updates']} mixture updates so far, "
            f"{'no main evaluation yet' if last is None else f'evaluated up to step {last}'} "
            f"of {summary['total_steps']} steps)",
        ]
    lines += [
        f"targets: {', '.join(targets)}   constraints: {', '.join(constraints) or 'none'}",
        "",
    ]
    header = ["step", *[f"{t} (target)" for t in targets], *constraints, "feasible", "weights"]
    rows = []
    for line in records.evaluations:
        weights = " ".join(f"{k}={v:.2f}" for k, v in line.weights.items())
        rows.append(
            [
                str(line.step),
                *[_display(line.eval[t], kinds[t]) for t in targets],
                *[
                    f"{_display(line.eval[c], kinds[c])} ({line.constraint_slack[c]:+.3f})"
                    for c in constraints
                ],
                "no (backtracked)" if line.backtracked else "yes" if line.feasible else "no",
                weights,
            ]
        )
    lines += _table(header, rows)
    lines += [
        "",
        "eval split; constraint columns show value (slack = reference - value, >= 0 holds)",
        "",
    ]
    updates = update_lines(records)
    if updates:
        lines += [*updates, "", "one line per mixture update (controller.jsonl)", ""]
    lines += [f"note: {note}" for note in records.notes]
    if not records.finished:
        return "\n".join(lines).rstrip("\n")
    best = records.best_checkpoint
    if best is None:
        closest = summary.get("closest_to_feasible")
        lines.append("no feasible checkpoint: the base model stays the best choice (reduction 0%).")
        if closest:
            lines.append(
                f"closest to feasible: step {closest['step']}, worst violation "
                f"{closest['max_violation']:+.4f}"
            )
    else:
        lines.append(
            f"best feasible checkpoint: step {best.step} ({records.path / best.path}); "
            f"test perplexity reduction on the targets: "
            f"{100 * summary['constrained_ppl_reduction']:.1f}%"
        )
        if records.constraints:
            lines += margin_lines(records, best.step)
    lines += target_data_lines(records)
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
