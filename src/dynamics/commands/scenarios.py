"""``dynamics scenarios``: list and show the paper's 54 scenarios (tables tab:scenarios and
tab:accuracy_scenarios), and print the run config of one (``config``), which ``dynamics run
--scenario`` trains."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dynamics.commands.errors import UsageError
from dynamics.data.scenarios import DATASETS, Scenario, ScenarioError, list_scenarios, load_scenario

HELP = "List the paper's 54 scenarios, show one of them, or print its run config."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    list_parser = actions.add_parser("list", help="one line per scenario")
    list_parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show_parser = actions.add_parser("show", help="one scenario in full")
    show_parser.add_argument("name", help="scenario name, e.g. paper/s28")
    show_parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    config_parser = actions.add_parser(
        "config",
        help="the scenario's run config (YAML) with the paper's settings; "
        "dynamics run --scenario trains it",
    )
    config_parser.add_argument("name", help="scenario name, e.g. paper/s28")
    add_data_root_argument(config_parser)
    config_parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. model.name_or_path=Qwen/Qwen3-8B",
    )


def add_data_root_argument(parser: argparse.ArgumentParser) -> None:
    """``--data-root DIR`` (shared with ``dynamics run --scenario``)."""
    parser.add_argument(
        "--data-root",
        metavar="DIR",
        help="read every dataset from DIR/<ABBREV>.jsonl (or .json/.parquet), "
        "rows shaped like the hub's, instead of the hub (see docs/datasets.md)",
    )


def main(args: argparse.Namespace) -> int:
    if args.action == "config":
        print(
            build_scenario_config(args.name, list(args.overrides), args.data_root).to_yaml(), end=""
        )
        return 0
    if args.action == "list":
        scenarios = list_scenarios()
        if args.json:
            print(
                json.dumps([scenario_to_dict(s) for s in scenarios], indent=2, ensure_ascii=False)
            )
        else:
            print(_table(scenarios))
        return 0
    try:
        scenario = load_scenario(args.name)
    except ScenarioError as err:
        raise UsageError(str(err)) from None
    if args.json:
        print(json.dumps(scenario_to_dict(scenario), indent=2, ensure_ascii=False))
    else:
        print(_describe(scenario))
    return 0


def build_scenario_config(name: str, overrides: list[str], data_root: str | None) -> Any:
    """The validated ``RunConfig`` of scenario ``name``; bad input is a ``UsageError``."""
    # Imported here so that `dynamics scenarios list` never pays for torch and transformers.
    from dynamics.data.loading import DataError
    from dynamics.engine.config import ConfigError
    from dynamics.experiments.paper_scenarios import scenario_config

    try:
        return scenario_config(name, overrides, data_root)
    except (ScenarioError, ConfigError, DataError) as err:
        raise UsageError(str(err)) from None


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """The scenario as plain JSON data, with the dataset names spelled out."""
    return {
        "name": scenario.name,
        "number": scenario.number,
        "table": scenario.table,
        "n_T": scenario.n_T,
        "n_C": scenario.n_C,
        "N": scenario.N,
        "M": scenario.M,
        "targets": [
            {"abbrev": d.abbrev, "name": DATASETS[d.abbrev].name, "budget": d.budget}
            for d in scenario.targets
        ],
        "non_targets": [
            {"abbrev": d.abbrev, "name": DATASETS[d.abbrev].name, "budget": d.budget}
            for d in scenario.non_targets
        ],
        "constraints": [
            {"abbrev": c.abbrev, "name": DATASETS[c.abbrev].name, "metric": c.metric}
            for c in scenario.constraints
        ],
        "note": scenario.note,
    }


def format_budget(budget: int | None) -> str:
    """A sample budget the way the paper prints it: 2000 -> 2k, 1500 -> 1.5k, None -> unlimited."""
    if budget is None:
        return "unlimited"
    if budget >= 1000 and budget % 100 == 0:
        return f"{budget / 1000:g}k"
    return str(budget)


def _budget_label(budget: int | None) -> str:
    return "unlimited samples" if budget is None else f"{format_budget(budget)} samples"


def _constraint_label(abbrev: str, metric: str) -> str:
    return abbrev if metric == "loss" else f"{abbrev}(acc)"


def _table(scenarios: list[Scenario]) -> str:
    header = ("name", "n_T", "n_C", "N", "targets", "constraints")
    rows = [
        (
            s.name,
            str(s.n_T),
            str(s.n_C),
            str(s.N),
            ", ".join(f"{t.abbrev}({format_budget(t.budget)})" for t in s.targets),
            ", ".join(_constraint_label(c.abbrev, c.metric) for c in s.constraints),
        )
        for s in scenarios
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in [header, *rows]
    ]
    lines.append(
        "(acc) = accuracy constraint; all others are loss constraints. "
        "`dynamics scenarios show NAME` for details."
    )
    return "\n".join(line.rstrip() for line in lines)


def _describe(scenario: Scenario) -> str:
    lines = [f"{scenario.name}  (scenario {scenario.number} of the paper's table {scenario.table})"]
    sections = (
        (
            f"targets (n_T={scenario.n_T})",
            [(d.abbrev, _budget_label(d.budget)) for d in scenario.targets],
        ),
        ("non-targets", [(d.abbrev, _budget_label(d.budget)) for d in scenario.non_targets]),
        (
            f"constraints (n_C={scenario.n_C})",
            [(c.abbrev, f"{c.metric} must not get worse") for c in scenario.constraints],
        ),
    )
    for title, entries in sections:
        lines.append(f"{title}:")
        for abbrev, detail in entries:
            lines.append(f"  {abbrev:<3} {DATASETS[abbrev].name:<22} {detail}")
    lines.append(
        f"N = {scenario.N} fine-tuning datasets (targets + non-targets), "
        f"M = {scenario.M} evaluation domains (targets + constraints)"
    )
    if scenario.note:
        lines.append(f"note: {scenario.note}")
    return "\n".join(lines)
