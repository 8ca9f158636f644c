"""The paper's comparison of methods from many run folders (``dynamics report DIR... --out``).

Runs are grouped into *scenarios* by their config with the method, the seed and the output
folder taken out: runs of one scenario differ only in method and seed. The numbers follow
the paper (section 4.5 and the appendices "Feasibility Rates", "Results by Number of
Constraints" and "Constraint Violation in Infeasible Scenarios"):

- a run's reduction is the constrained perplexity reduction (test split, best feasible
  checkpoint chosen on eval, 0 when infeasible); a scenario's value for a method is the
  mean over its seeds;
- the fixed baselines enter as the *oracle best*: per seed, the best fixed mixture of the
  scenario, then the mean over seeds;
- best@k: per scenario, the expected best reduction of k fixed runs drawn with replacement
  from all its fixed runs, then the median over scenarios; feasible@k: the probability
  that one of k draws is feasible, averaged over scenarios;
- cost: the cost model's multiple of one fixed run (``predicted_cost`` in summary.json),
  so that a noisy shared machine does not move the axis; measured wall-time ratios are in
  report.json too;
- violation: the maximum constraint violation at the checkpoint closest to feasibility,
  in scenarios where a method and every fixed run were infeasible on every seed; the
  baselines' value is that of their least violating configuration (mean over seeds).
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dynamics.core import metrics
from dynamics.report.plotting import plot_weights, pyplot, save
from dynamics.runs import rundir

FIXED = "fixed (oracle best)"


@dataclass(frozen=True)
class RunResult:
    """What the comparison needs from one finished run folder."""

    path: Path
    scenario_key: str
    method: str  # e.g. dynamics-dense-warmup; "fixed" for every fixed mixture
    mixture: str  # the fixed weights, or the method again
    seed: int
    feasible: bool
    reduction: float
    predicted_cost: float
    train_seconds: float
    num_constraints: int
    max_violation: float | None
    records: rundir.RunRecords


def _schedule_label(schedule: Any) -> str:
    if isinstance(schedule, list):
        return "steps" + "-".join(str(s) for s in schedule)
    return str(schedule).replace(":", "")


def method_label(method: dict[str, Any]) -> str:
    """The method of a run config's ``method`` section, as the sweep names its folders and
    the report its columns (fixed mixtures all belong to "fixed")."""
    if method["name"] == "fixed":
        return "fixed"
    if method["name"] == "gradient-alignment":
        return "gradient-alignment-" + _schedule_label(method["schedule"])
    label = "dynamics-" + _schedule_label(method["schedule"])
    label += "" if method.get("variant", "paper") == "paper" else f"-{method['variant']}"
    return label + (
        "" if method.get("predictor", "linear") == "linear" else f"-{method['predictor']}"
    )


def find_run_folders(paths: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    """(finished run folders, unfinished ones) under ``paths``: a folder with a config.yaml
    is a run; it is finished when it holds summary.json."""
    finished: list[Path] = []
    unfinished: list[Path] = []
    seen: set[Path] = set()
    for root in map(Path, paths):
        if not root.is_dir():
            raise rundir.RunDirError(f"{root} is not a folder: give run folders or sweep folders")
        candidates = (
            [root]
            if (root / rundir.CONFIG_FILE).is_file()
            else sorted(p.parent for p in root.rglob(rundir.CONFIG_FILE))
        )
        for folder in candidates:
            if any(part.startswith(".") for part in folder.relative_to(root).parts):
                continue  # a resume point's or a checkpoint's own files
            if folder.resolve() in seen:
                continue  # given twice (a sweep folder and a folder inside it)
            seen.add(folder.resolve())
            (finished if (folder / rundir.SUMMARY_FILE).is_file() else unfinished).append(folder)
    return finished, unfinished


def check_distinct(results: Sequence[RunResult]) -> None:
    """Refuse two runs of one scenario with the same method (or fixed mixture) and seed,
    e.g. two sweep folders of the same sweep file: their numbers would overwrite each
    other's in the per-seed statistics."""
    seen: dict[tuple[str, str, str, int], RunResult] = {}
    for result in results:
        key = (result.scenario_key, result.method, result.mixture, result.seed)
        if key in seen:
            what = (
                f"fixed mixture {result.mixture}"
                if result.method == "fixed"
                else f"method {result.method}"
            )
            raise rundir.RunDirError(
                f"{seen[key].path} and {result.path} are the same run (the same config, {what}, "
                f"seed "
                f"{result.seed}): report them separately (one dynamics report each), or leave one "
                f"of them out"
            )
        seen[key] = result


def read_result(folder: Path) -> RunResult:
    records = rundir.read_run(folder)
    config = yaml.safe_load((folder / rundir.CONFIG_FILE).read_text())
    method = config["method"]
    scenario = {k: v for k, v in config.items() if k not in ("method", "output_dir")}
    scenario["training"] = {k: v for k, v in config["training"].items() if k != "seed"}
    closest = records.summary.get("closest_to_feasible")
    label = method_label(method)
    weights = method.get("weights") or {}
    return RunResult(
        path=folder,
        scenario_key=json.dumps(scenario, sort_keys=True),
        method=label,
        mixture=" ".join(f"{k}={v:g}" for k, v in weights.items()) if label == "fixed" else label,
        seed=int(config["training"]["seed"]),
        feasible=bool(records.summary["feasible"]),
        reduction=float(records.summary["constrained_ppl_reduction"]),
        predicted_cost=float(records.summary["predicted_cost"]),
        train_seconds=float(records.summary["train_seconds"]),
        num_constraints=len(records.constraints),
        max_violation=None if closest is None else float(closest["max_violation"]),
        records=records,
    )


def scenario_names(results: Sequence[RunResult]) -> dict[str, str]:
    """A readable name per scenario key: the sweep's config folder (DIR/<config>/<method>/seedN)
    when its runs are laid out that way, else ``scenario-<n>``."""
    names: dict[str, str] = {}
    for result in results:
        if result.scenario_key in names:
            continue
        path = result.path
        name = (
            path.parent.parent.name
            if re.fullmatch(r"seed\d+", path.name)
            else f"scenario-{len(names) + 1}"
        )
        while name in names.values():
            name += "'"
        names[result.scenario_key] = name
    return names


def _mean(values: Iterable[float]) -> float:
    return float(np.mean(list(values)))


def aggregate(results: Sequence[RunResult]) -> dict[str, Any]:
    """Every number the sweep report shows (report.json), from the runs' results; raises
    :class:`~dynamics.runs.rundir.RunDirError` when two of them are the same run."""
    check_distinct(results)
    names = scenario_names(results)
    by_scenario: dict[str, list[RunResult]] = defaultdict(list)
    for result in results:
        by_scenario[names[result.scenario_key]].append(result)
    methods = sorted({r.method for r in results if r.method != "fixed"})
    scenarios: dict[str, Any] = {}
    for name, runs in by_scenario.items():
        fixed = [r for r in runs if r.method == "fixed"]
        entry: dict[str, Any] = {"num_constraints": runs[0].num_constraints, "methods": {}}
        for method in methods:
            mine = [r for r in runs if r.method == method]
            if mine:
                entry["methods"][method] = _method_entry(mine)
        if fixed:
            seeds = sorted({r.seed for r in fixed})
            oracle = [max(r.reduction for r in fixed if r.seed == s) for s in seeds]
            per_mixture: dict[str, list[RunResult]] = defaultdict(list)
            for r in fixed:
                per_mixture[r.mixture].append(r)
            violations = []
            for group in per_mixture.values():
                found = [r.max_violation for r in group if r.max_violation is not None]
                if len(found) == len(group):  # a mixture without constraints has no violation
                    violations.append(_mean(found))
            unit = statistics.median(r.train_seconds for r in fixed)
            entry["fixed"] = {
                "runs": len(fixed),
                "mixtures": {
                    m: {
                        "reduction": _mean(r.reduction for r in g),
                        "feasible_rate": _mean(r.feasible for r in g),
                    }
                    for m, g in per_mixture.items()
                },
                "oracle_reduction": _mean(oracle),
                "oracle_reduction_per_seed": dict(zip(map(str, seeds), oracle, strict=True)),
                "feasible_any": any(r.feasible for r in fixed),
                "best_violation": min(violations) if violations else None,
                "pool_reductions": [r.reduction for r in fixed],
                "pool_feasible": [r.feasible for r in fixed],
                "median_train_seconds": unit,
            }
            for method, values in entry["methods"].items():
                mine = [r for r in runs if r.method == method]
                values["measured_cost"] = _mean(r.train_seconds / unit for r in mine)
        scenarios[name] = entry
    return {
        "scenarios": scenarios,
        "methods": {m: _summary(m, scenarios) for m in methods},
        "fixed": _fixed_summary(scenarios),
        "by_constraints": _by_constraints(scenarios, methods),
        "violation_jointly_infeasible": _violations(scenarios, methods),
        "conventions": {
            "reduction": "constrained perplexity reduction, test split, best feasible checkpoint "
            "on eval; 0 if infeasible",
            "cost": "cost model: multiples of one fixed run (summary.json predicted_cost)",
            "measured_cost": "training wall time over the scenario's median fixed run",
        },
    }


def _method_entry(runs: list[RunResult]) -> dict[str, Any]:
    violations = [r.max_violation for r in runs if r.max_violation is not None]
    return {
        "reduction": _mean(r.reduction for r in runs),
        "reduction_per_seed": {str(r.seed): r.reduction for r in runs},
        "feasible_rate": _mean(r.feasible for r in runs),
        "feasible_per_seed": {str(r.seed): r.feasible for r in runs},
        "predicted_cost": _mean(r.predicted_cost for r in runs),
        "violation": _mean(violations) if len(violations) == len(runs) else None,
        "seeds": len(runs),
    }


def _summary(method: str, scenarios: dict[str, Any]) -> dict[str, Any]:
    entries = [s["methods"][method] for s in scenarios.values() if method in s["methods"]]
    # The paper's spread: the statistic over scenarios computed per seed, then its std over seeds.
    seeds = sorted({seed for e in entries for seed in e["reduction_per_seed"]}, key=int)
    medians = [
        float(
            np.median([e["reduction_per_seed"][s] for e in entries if s in e["reduction_per_seed"]])
        )
        for s in seeds
    ]
    rates = [
        _mean(e["feasible_per_seed"][s] for e in entries if s in e["feasible_per_seed"])
        for s in seeds
    ]
    return {
        "scenarios": len(entries),
        "median_reduction": float(np.median([e["reduction"] for e in entries])),
        "median_reduction_std_over_seeds": float(np.std(medians)),
        "feasibility_rate": _mean(e["feasible_rate"] for e in entries),
        "feasibility_rate_std_over_seeds": float(np.std(rates)),
        "median_predicted_cost": float(np.median([e["predicted_cost"] for e in entries])),
    }


def _fixed_summary(scenarios: dict[str, Any]) -> dict[str, Any] | None:
    pools = [s["fixed"] for s in scenarios.values() if "fixed" in s]
    if not pools:
        return None
    largest = max(p["runs"] for p in pools)
    ks = list(range(1, max(largest, 1) + 1))
    return {
        "scenarios": len(pools),
        "mixtures": max(len(p["mixtures"]) for p in pools),
        "median_oracle_reduction": float(np.median([p["oracle_reduction"] for p in pools])),
        "best_at_k": {
            str(k): float(np.median([metrics.best_at_k(p["pool_reductions"], k) for p in pools]))
            for k in ks
        },
        "feasible_at_k": {
            str(k): _mean(metrics.feasible_at_k(p["pool_feasible"], k) for p in pools) for k in ks
        },
    }


def _by_constraints(
    scenarios: dict[str, Any], methods: list[str]
) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {}
    for entry in scenarios.values():
        group = out.setdefault(str(entry["num_constraints"]), {})
        for method in methods:
            if method in entry["methods"]:
                group.setdefault(method, []).append(entry["methods"][method]["reduction"])
        if "fixed" in entry:
            group.setdefault(FIXED, []).append(entry["fixed"]["oracle_reduction"])
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def _violations(scenarios: dict[str, Any], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method: the scenarios where it and every fixed run were infeasible on every seed,
    with its violation and the best baseline's."""
    out: dict[str, dict[str, Any]] = {}
    for method in methods:
        rows = {
            name: {
                "method": entry["methods"][method]["violation"],
                "fixed": entry["fixed"]["best_violation"],
            }
            for name, entry in scenarios.items()
            if method in entry["methods"]
            and "fixed" in entry
            and entry["methods"][method]["feasible_rate"] == 0
            and not entry["fixed"]["feasible_any"]
            and entry["methods"][method]["violation"] is not None
            and entry["fixed"]["best_violation"] is not None
        }
        out[method] = rows
    return out


def _colors(methods: Sequence[str]) -> dict[str, Any]:
    cmap = pyplot().get_cmap("tab10")
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


def write_sweep_figures(
    numbers: dict[str, Any], results: Sequence[RunResult], folder: Path
) -> dict[str, str]:
    """The comparison figures as PNG in ``folder``; returns {figure: file name}."""
    plt = pyplot()
    files: dict[str, str] = {}
    scenarios = numbers["scenarios"]
    methods = list(numbers["methods"])
    colors = _colors([*methods, FIXED])
    fixed = numbers["fixed"]
    rng = np.random.default_rng(0)  # jitter of the dots only

    columns = [*methods, *([FIXED] if fixed else [])]
    values = [
        [
            100 * (s["methods"][m]["reduction"] if m != FIXED else s["fixed"]["oracle_reduction"])
            for s in scenarios.values()
            if (m in s["methods"] if m != FIXED else "fixed" in s)
        ]
        for m in columns
    ]
    fig, ax = plt.subplots(figsize=(1.6 * len(columns) + 3, 4))
    ax.boxplot(values, showfliers=False)
    ax.set_xticks(range(1, len(columns) + 1), columns, rotation=20, ha="right", fontsize=8)
    for i, (column, vals) in enumerate(zip(columns, values, strict=True), start=1):
        ax.scatter(
            i + rng.uniform(-0.12, 0.12, len(vals)), vals, s=14, color=colors[column], zorder=3
        )
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set(
        ylabel="test PPL reduction (%)",
        title=f"Reduction per scenario ({len(scenarios)} scenarios, one dot each)",
    )
    files["reduction"] = save(fig, folder, "reduction_boxplot.png")

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if fixed:
        ks = [int(k) for k in fixed["best_at_k"]]
        left.plot(
            ks,
            [100 * v for v in fixed["best_at_k"].values()],
            marker="*",
            markersize=10,
            color=colors[FIXED],
            label="fixed: best@k (cost k)",
        )
        right.plot(
            ks,
            [100 * v for v in fixed["feasible_at_k"].values()],
            marker="*",
            markersize=10,
            color=colors[FIXED],
            label="fixed: feasible@k (cost k)",
        )
    for method in methods:
        summary = numbers["methods"][method]
        cost = summary["median_predicted_cost"]
        left.errorbar(
            [cost],
            [100 * summary["median_reduction"]],
            yerr=[100 * summary["median_reduction_std_over_seeds"]],
            fmt="o",
            markersize=8,
            color=colors[method],
            mec="black",
            capsize=4,
            zorder=3,
            label=method,
        )
        right.errorbar(
            [cost],
            [100 * summary["feasibility_rate"]],
            yerr=[100 * summary["feasibility_rate_std_over_seeds"]],
            fmt="o",
            markersize=8,
            color=colors[method],
            mec="black",
            capsize=4,
            zorder=3,
            label=method,
        )
    left.set(
        xlabel="cost (multiples of one fixed run, cost model)",
        ylabel="median test PPL reduction (%)",
        title="Median reduction vs cost",
    )
    right.set(
        xlabel="cost (multiples of one fixed run, cost model)",
        ylabel="feasible runs (%)",
        title="Feasibility rate vs cost",
        ylim=(-3, 103),
    )
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    files["cost"] = save(fig, folder, "reduction_and_feasibility_vs_cost.png")

    groups = numbers["by_constraints"]
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(groups) * max(1, len(columns)) / 2), 4))
    width = 0.8 / max(1, len(columns))
    for g, group in enumerate(groups.values()):
        for c, column in enumerate(columns):
            vals = [100 * v for v in group.get(column, [])]
            if not vals:
                continue
            x = g + (c - (len(columns) - 1) / 2) * width
            ax.boxplot([vals], positions=[x], widths=width * 0.8, showfliers=False)
            ax.scatter(
                x + rng.uniform(-width / 5, width / 5, len(vals)),
                vals,
                s=12,
                color=colors[column],
                zorder=3,
                label=column if g == 0 else None,
            )
    ax.set_xticks(range(len(groups)), [f"{k} constraints" for k in groups])
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set(
        ylabel="test PPL reduction (%)",
        title="Reduction by number of constraints (one dot per scenario)",
    )
    ax.legend(fontsize=7)
    files["by_constraints"] = save(fig, folder, "reduction_by_constraints.png")

    violation = numbers["violation_jointly_infeasible"]
    fig, ax = plt.subplots(figsize=(max(6.5, 2.6 * len(violation)), 4))
    ticks, labels = [], []
    for i, (method, rows) in enumerate(violation.items()):
        for offset, key, label in ((-0.2, "method", method), (0.2, "fixed", "best fixed")):
            vals = [max(0.0, r[key]) for r in rows.values()]
            ax.scatter(
                i + offset + rng.uniform(-0.05, 0.05, len(vals)),
                vals,
                s=16,
                color=colors[method if key == "method" else FIXED],
                zorder=3,
            )
            ticks.append(i + offset)
            labels.append(f"{label}\n({len(vals)} scenarios)")
    ax.set_xticks(ticks, labels, fontsize=7, rotation=20, ha="right")
    ax.set_xlim(-0.6, max(1, len(violation)) - 0.4)
    if not any(violation.values()):
        ax.text(
            0.5,
            0.5,
            "no jointly infeasible scenario:\nevery scenario had a feasible run",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="grey",
        )
        ax.set_ylim(0, 1)
    else:
        ax.set_ylim(bottom=0)
    ax.set(
        ylabel="max violation (closest checkpoint)",
        title="Violation, jointly infeasible scenarios (lower is better)",
    )
    files["violation"] = save(fig, folder, "violation_jointly_infeasible.png")

    for method in methods:
        mine: dict[str, RunResult] = {}
        for result in sorted(results, key=lambda r: r.seed):
            if result.method == method:
                mine.setdefault(scenario_names(results)[result.scenario_key], result)
        cols = min(4, len(mine))
        rows_n = -(-len(mine) // cols)
        fig, axes = plt.subplots(rows_n, cols, figsize=(3.6 * cols, 2.7 * rows_n), squeeze=False)
        for ax, (name, result) in zip(axes.flat, sorted(mine.items()), strict=False):
            plot_weights(ax, result.records)
            ax.set(title=f"{name} (seed {result.seed})", xlabel="step", ylabel="weight")
            ax.legend(fontsize=6)
        for ax in list(axes.flat)[len(mine) :]:
            ax.axis("off")
        files[f"weights:{method}"] = save(fig, folder, f"weights_{method}.png")
    return files
