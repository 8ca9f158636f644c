"""``dynamics report PATH... --out REPORT_DIR``: the figures as PNG, the same numbers as
``report.json``, and ``index.html``, one self-contained page (images embedded as base64, no
external scripts or style sheets) that opens from disk in any browser.

One finished run folder gives that run's figures (:mod:`dynamics.report.run_figures`);
anything else (sweep folders, several run folders) gives the paper's comparison of
methods over scenarios (:mod:`dynamics.report.sweep`).
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynamics.report.run_figures import run_numbers, write_run_figures
from dynamics.report.sweep import (
    FIXED,
    aggregate,
    find_run_folders,
    read_result,
    write_sweep_figures,
)
from dynamics.runs import rundir

STYLE = """
body {
  font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em;
  color: #222;
}
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; margin-bottom: 1.5em; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _figure(folder: Path, name: str, caption: str) -> str:
    data = base64.b64encode((folder / name).read_bytes()).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(caption)} "
        f"(<code>{html.escape(name)}</code>)</figcaption></figure>"
    )


def _page(title: str, body: list[str]) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta '
        f'charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def write_report(paths: Sequence[str | Path], out: Path) -> dict[str, Any]:
    """Write the report of ``paths`` into ``out``; returns what report.json holds."""
    folders = [Path(p) for p in paths]
    if len(folders) == 1 and (folders[0] / rundir.SUMMARY_FILE).is_file():
        return write_run_report(folders[0], out)
    finished, unfinished = find_run_folders(folders)
    if not finished:
        raise rundir.RunDirError(
            f"no finished run folder (one with summary.json) under {', '.join(map(str, folders))}: "
            "give folders written by dynamics run or dynamics sweep"
        )
    return write_sweep_report([read_result(f) for f in finished], unfinished, out)


def write_run_report(path: Path, out: Path) -> dict[str, Any]:
    records = rundir.read_run(path)
    files = write_run_figures(records, out)
    numbers = {"kind": "run", **run_numbers(records), "figures": files}
    rundir.write_json(out / "report.json", numbers)
    summary = records.summary
    best = records.best_checkpoint
    closest = summary.get("closest_to_feasible")
    verdict = (
        f"Feasible: best checkpoint at step {best.step}, test perplexity reduction on the targets "
        f"{_pct(summary['constrained_ppl_reduction'])}."
        if best is not None
        else "Infeasible: no checkpoint after step 0 kept every constraint while lowering the "
        "targets (reduction 0%)"
        + (
            f"; closest at step {closest['step']}, worst violation {closest['max_violation']:+.4f}."
            if closest
            else "."
        )
    )
    captions = {
        "weights": "Mixture weights over training, piecewise constant between updates.",
        "losses": "Every evaluation domain over training, eval and test splits, against its "
        "step-0 value (dashed). Loss domains in nats (lower is better), accuracy domains as "
        "accuracy (higher is "
        "better).",
        "slack": "Each constraint's slack (step-0 reference minus value, eval split): at or "
        "above 0 the constraint holds.",
        "predictions": "At each update: the value predicted for the next update (circles) and "
        "the value realized there (crosses), per domain.",
    }
    body = [
        f"<p>Run folder <code>{html.escape(str(path))}</code>; method "
        f"<code>{html.escape(summary['policy'])}</code>, "
        f"{summary['num_updates']} updates, {summary['total_steps']} steps, predicted cost "
        f"{summary['predicted_cost']:.2f}x one fixed run "
        f"({html.escape(summary['cost_assumption'])}).</p>",
        f"<p><b>{html.escape(verdict)}</b></p>",
        *[
            _figure(out, files[key], captions[key])
            for key in ("weights", "losses", "slack", "predictions")
            if key in files
        ],
    ]
    if "predictions" not in files:
        body.append("<p>No predictions: this run's policy does not predict (fixed weights).</p>")
    rundir.atomic_write_text(
        out / "index.html",
        _page(f"dynamics run report: {'/'.join(path.resolve().parts[-3:])}", body),
    )
    return numbers


def write_sweep_report(results: list[Any], unfinished: list[Path], out: Path) -> dict[str, Any]:
    numbers = aggregate(results)
    files = write_sweep_figures(numbers, results, out)
    report = {
        "kind": "sweep",
        **numbers,
        "runs": [
            {
                "path": str(r.path),
                "method": r.method,
                "mixture": r.mixture,
                "seed": r.seed,
                "feasible": r.feasible,
                "reduction": r.reduction,
                "predicted_cost": r.predicted_cost,
                "train_seconds": r.train_seconds,
            }
            for r in results
        ],
        "unfinished": [str(p) for p in unfinished],
        "figures": files,
    }
    rundir.write_json(out / "report.json", json.loads(json.dumps(report)))
    methods = numbers["methods"]
    fixed = numbers["fixed"]
    rows = [
        [
            m,
            str(s["scenarios"]),
            _pct(s["median_reduction"]),
            _pct(s["feasibility_rate"]),
            f"{s['median_predicted_cost']:.2f}x",
        ]
        for m, s in methods.items()
    ]
    if fixed:
        # The oracle runs every fixed mixture once per seed: k = the number of mixtures.
        k = fixed["mixtures"]
        rows.append(
            [
                FIXED,
                str(fixed["scenarios"]),
                _pct(fixed["median_oracle_reduction"]),
                f"{_pct(fixed['feasible_at_k'][str(k)])} (feasible@{k})",
                f"{k}x",
            ]
        )
    scenario_rows = []
    for name, entry in numbers["scenarios"].items():
        cells = [name, str(entry["num_constraints"])]
        cells += [
            _pct(entry["methods"][m]["reduction"]) if m in entry["methods"] else "-"
            for m in methods
        ]
        cells.append(_pct(entry["fixed"]["oracle_reduction"]) if "fixed" in entry else "-")
        scenario_rows.append(cells)
    captions = {
        "reduction": "Test perplexity reduction per scenario (mean over seeds; 0 for an "
        "infeasible run), one dot per scenario. Fixed baselines as the oracle best: the best fixed "
        "mixture of the scenario per "
        "seed.",
        "cost": "Left: median reduction against cost. Stars: best@k, the expected best of k "
        "fixed runs (cost k), median over scenarios; circles: one run of each method at its "
        "cost-model cost, with the std over seeds of the per-seed median. Right: the share of "
        "feasible runs (std over seeds); stars: feasible@k, the chance that one of k fixed runs "
        "is feasible.",
        "by_constraints": "Reduction grouped by the scenarios' number of constraints.",
        "violation": "Maximum constraint violation at the checkpoint closest to feasibility, in "
        "the scenarios where the method and every fixed run were infeasible on every seed (clipped "
        "at 0).",
    }
    body = [
        f"<p>{len(results)} finished runs in {len(numbers['scenarios'])} scenarios"
        + (f"; {len(unfinished)} unfinished run folders left out" if unfinished else "")
        + ". Reduction: constrained test perplexity reduction (best feasible checkpoint chosen "
        "on the eval split, 0 when infeasible). Cost: the cost model's multiple of one fixed "
        "run.</p>",
        "<h2>Methods</h2>",
        _table(["method", "scenarios", "median reduction", "feasible", "cost"], rows),
        *[
            _figure(out, files[key], captions[key])
            for key in ("reduction", "cost", "by_constraints", "violation")
        ],
        "<h2>Scenarios</h2>",
        _table(["scenario", "constraints", *methods, FIXED], scenario_rows),
        "<h2>Weight trajectories</h2>",
        *[
            _figure(
                out,
                name,
                f"{key.split(':', 1)[1]}: mixture weights over training, first seed of each "
                f"scenario.",
            )
            for key, name in files.items()
            if key.startswith("weights:")
        ],
    ]
    rundir.atomic_write_text(out / "index.html", _page("dynamics sweep report", body))
    return report
