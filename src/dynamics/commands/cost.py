"""``dynamics cost``: DynaMiCS compute cost as a multiple of one fixed-mixture run (paper:
app:compute_costs)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dynamics.commands.errors import UsageError
from dynamics.core.cost import (
    DEFAULT_TRAIN_FWD_RATIO,
    PREDICTOR_EVALS,
    CostModel,
    paper_cost_tables,
    run_cost,
)
from dynamics.core.schedules import (
    PAPER_TOTAL_STEPS,
    SCHEDULE_HELP,
    ScheduleError,
    UpdateSchedule,
    build_schedule,
)
from dynamics.data.scenarios import ScenarioError, list_scenarios, load_scenario

HELP = (
    "Compute cost of a DynaMiCS run as a multiple of one fixed-mixture run "
    "(the paper's cost model)."
)

_M_MEANING = "M = targets + constraints"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario", help="scenario name, e.g. paper/s28 (see `dynamics scenarios list`)"
    )
    parser.add_argument(
        "--schedule",
        default=None,
        help=f"update schedule (default dense-warmup): {SCHEDULE_HELP}, e.g. 0,64,512",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"training steps of the run (default {PAPER_TOTAL_STEPS})",
    )
    parser.add_argument(
        "--probe-cap",
        type=int,
        default=None,
        help="c_max, probe steps per dataset (default 128 scaled to --steps)",
    )
    parser.add_argument(
        "--probe-min",
        type=int,
        default=None,
        help="the fewest steps a probe trains (method.probe_min; default 1)",
    )
    parser.add_argument(
        "--train-fwd-ratio",
        type=float,
        default=DEFAULT_TRAIN_FWD_RATIO,
        help="cost of one training step in forward passes of the same batch (default "
        f"{DEFAULT_TRAIN_FWD_RATIO:g})",
    )
    parser.add_argument(
        "--predictor",
        choices=list(PREDICTOR_EVALS),
        default=None,
        help="slope predictor (default linear; curve = 5 evaluations per probe)",
    )
    parser.add_argument(
        "--paper-tables",
        action="store_true",
        help="the paper's three cost tables: our means over the 50 scenarios",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def main(args: argparse.Namespace) -> int:
    if not args.train_fwd_ratio > 0:
        raise UsageError(f"--train-fwd-ratio must be positive, got {args.train_fwd_ratio:g}")
    if args.paper_tables:
        return _paper_tables(args)
    if args.scenario is None:
        raise UsageError("give --scenario NAME (e.g. paper/s28) or --paper-tables")
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as err:
        raise UsageError(str(err)) from None
    schedule = _schedule(args)
    predictor = args.predictor or "linear"
    model = CostModel.for_predictor(predictor, args.train_fwd_ratio)
    cost = run_cost(schedule, scenario.N, scenario.M, model)

    if args.json:
        report: dict[str, Any] = {
            "scenario": scenario.name,
            "N": scenario.N,
            "M": scenario.M,
            "schedule": schedule.name,
            "total_steps": schedule.total_steps,
            "predictor": predictor,
            "n_evals": model.n_evals,
            "train_fwd_ratio": model.train_fwd_ratio,
            "unit": "forward passes of one batch",
            "updates": [
                {
                    "step": int(t),
                    "horizon": int(h),
                    "probe_budget": int(c),
                    "recycled": bool(r),
                    "baseline": float(b),
                    "overhead": float(o),
                    "beta": float(o / b),
                }
                for t, h, c, r, b, o in zip(
                    cost.steps,
                    cost.horizons,
                    cost.probe_budgets,
                    cost.recycled,
                    cost.baseline,
                    cost.overhead,
                    strict=True,
                )
            ],
            "baseline_total": float(cost.baseline.sum()),
            "total": cost.total,
            "relative_cost": cost.relative,
        }
        print(json.dumps(report, indent=2))
        return 0

    print(
        f"{scenario.name}: N = {scenario.N} fine-tuning datasets, "
        f"M = {scenario.M} evaluation domains "
        f"({scenario.n_T} targets + {scenario.n_C} constraints)"
    )
    print(
        f"schedule {schedule.name}, {schedule.total_steps} steps, {len(schedule)} updates, "
        f"{predictor} predictor ({model.n_evals} reduced "
        f"evaluation{'s' if model.n_evals > 1 else ''} per probe)"
    )
    print(_assumption(model.train_fwd_ratio))
    print()
    print(
        f"{'step':>6} {'H_t':>5} {'c_t':>5} {'recycled':>9} {'baseline rho_t':>15} "
        f"{'overhead':>12} {'beta_t':>8}"
    )
    for t, h, c, r, b, o in zip(
        cost.steps,
        cost.horizons,
        cost.probe_budgets,
        cost.recycled,
        cost.baseline,
        cost.overhead,
        strict=True,
    ):
        print(
            f"{t:>6} {h:>5} {c:>5} {'yes' if r else 'no':>9} {b:>15,.0f} {o:>12,.0f} {o / b:>8.2f}"
        )
    print()
    print(
        f"total: {cost.relative:.2f}x one fixed-mixture run ({cost.total:,.0f} vs "
        f"{cost.baseline.sum():,.0f} forward passes)"
    )
    return 0


def _schedule(args: argparse.Namespace) -> UpdateSchedule:
    steps = PAPER_TOTAL_STEPS if args.steps is None else args.steps
    text = args.schedule or "dense-warmup"
    spec: str | list[int] = text
    if "," in text:
        try:
            spec = [int(s) for s in text.split(",")]
        except ValueError:
            raise UsageError(
                f"--schedule {text!r}: a list of steps must be integers separated by commas"
            ) from None
    try:
        return build_schedule(
            spec, steps, args.probe_cap, 1 if args.probe_min is None else args.probe_min
        )
    except ScheduleError as err:
        option = {"total_steps": "--steps", "probe_cap": "--probe-cap", "probe_min": "--probe-min"}
        raise UsageError(f"{option.get(err.argument, '--schedule')}: {err}") from None


def _assumption(ratio: float) -> str:
    return (
        f"assumes one training step = {ratio:g} forward passes of the same batch "
        f"(--train-fwd-ratio); {_M_MEANING}"
    )


def _paper_tables(args: argparse.Namespace) -> int:
    # The tables are defined by the paper's settings; options that would change them are refused.
    options = {
        "--scenario": args.scenario,
        "--schedule": args.schedule,
        "--steps": args.steps,
        "--probe-cap": args.probe_cap,
        "--probe-min": args.probe_min,
        "--predictor": args.predictor,
    }
    for option, value in options.items():
        if value is not None:
            raise UsageError(
                f"{option} cannot be combined with --paper-tables: the tables fix the paper's 50 "
                "scenarios, schedules and predictors at 2048 steps and c_max = 128 "
                "(only --train-fwd-ratio applies)"
            )
    paper_scenarios = [s for s in list_scenarios() if s.table == "tab:scenarios"]
    results = paper_cost_tables([(s.N, s.M) for s in paper_scenarios], args.train_fwd_ratio)

    if args.json:
        report = {
            "train_fwd_ratio": args.train_fwd_ratio,
            "n_scenarios": len(paper_scenarios),
            "M": "targets + constraints",
            "rows": [
                {
                    "table": row.table,
                    "schedule": row.schedule,
                    "predictor": row.predictor,
                    "paper": row.paper_value,
                    "computed": value,
                }
                for row, value in results
            ],
        }
        print(json.dumps(report, indent=2))
        return 0

    print(
        f"Mean cost over the paper's {len(paper_scenarios)} scenarios, "
        "as multiples of one fixed-mixture run"
    )
    print(_assumption(args.train_fwd_ratio))
    print()
    print(
        f"{'table':<20} {'schedule':<13} {'predictor':<9} {'computed':>8} {'paper':>7} {'diff':>6}"
    )
    for row, value in results:
        paper = f"~{row.paper_value:.1f}x"
        print(
            f"{row.table:<20} {row.schedule:<13} {row.predictor:<9} {value:>7.2f}x {paper:>7} "
            f"{value - row.paper_value:>+6.2f}"
        )
    return 0
