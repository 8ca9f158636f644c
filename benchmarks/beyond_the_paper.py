"""The paper's method against the robustness options and a fine fixed sweep, on offline
scenarios with several seeds (``benchmarks/results/beyond-the-paper-notebook.md``).

    .venv/bin/python benchmarks/beyond_the_paper.py [--out runs/beyond]
        [--scenarios demo,conflict,unconstrained] [--seeds 0,1,2] [--methods paper,robust,...]
        [--no-fixed] [--report-only] [--jobs N]
        [--fixed-from benchmarks/results/protocol.json ...] [--goal robust]
    .venv/bin/python benchmarks/beyond_the_paper.py --combine A.json B.json --json C.json
        [--goal robust]

Runs that already finished under ``--out`` are skipped, so the command resumes. Every run
trains on one thread, ``--jobs`` at a time (default: the CPU cores available). It then
aggregates every finished run under ``--out`` into ``--json`` (default ``<out>/report.json``,
so that a partial run never overwrites the committed results in ``benchmarks/results/``)
and prints the tables. Checkpoints are chosen on the eval split, reductions are reported on
the test split; costs are training wall time over the same seed's median fixed run.
``--fixed-from`` takes the fixed sweep of every scenario and seed that has none under
``--out`` from earlier reports, so that a change to the controller needs only its own runs
(those seeds get no cost and no comparison at equal cost: wall times of two occasions do
not divide). ``--combine`` trains nothing: it writes the seeds of several reports (of
different seeds) as one report to ``--json``, so that the goal is read over all of them.
``--goal METHOD`` prints, after the tables, the goal for a default read for that
method, condition by condition (benchmarks/goal.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from dynamics.experiments.base_model import ensure_base_model  # noqa: E402
from dynamics.experiments.demo import DEMO_BASE_SPEC, available_cores  # noqa: E402
from dynamics.runs import rundir  # noqa: E402
from goal import goal_markdown  # noqa: E402
from robustness import (  # noqa: E402
    METHODS,
    SCENARIOS,
    combine_reports,
    markdown,
    measure,
    read_each,
    read_reports,
    write_report,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "beyond")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--no-fixed", action="store_true", help="skip the fixed sweep")
    parser.add_argument("--jobs", type=int, default=available_cores(), help="runs trained at once")
    parser.add_argument("--report-only", action="store_true", help="only aggregate finished runs")
    parser.add_argument(
        "--json", type=Path, help="where the report goes (default: <out>/report.json)"
    )
    parser.add_argument(
        "--fixed-from",
        type=Path,
        nargs="+",
        default=[],
        help="earlier reports whose fixed sweeps fill the seeds without one",
    )
    parser.add_argument(
        "--combine",
        type=Path,
        nargs="+",
        default=[],
        metavar="REPORT",
        help="train nothing: write the seeds of these reports as one report to --json",
    )
    parser.add_argument(
        "--goal",
        action="append",
        default=[],
        metavar="METHOD",
        help="print the goal for a default, condition by condition, for METHOD (repeatable)",
    )
    args = parser.parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(scenarios) - set(SCENARIOS)) + sorted(
        set(methods + args.goal) - set(METHODS)
    )
    if unknown:
        parser.error(
            f"unknown scenarios or methods {unknown}: use {sorted(SCENARIOS)} and {sorted(METHODS)}"
        )
    try:
        fixed_from = read_reports(args.fixed_from)
    except FileNotFoundError as error:
        parser.error(f"--fixed-from: {error}")
    if args.combine:
        if args.json is None:
            parser.error("--combine writes a new report: name it with --json")
        try:
            report = combine_reports(read_each(args.combine))
        except (FileNotFoundError, ValueError) as error:
            parser.error(f"--combine: {error}")
        rundir.atomic_write_text(args.json, json.dumps(report, indent=1) + "\n")
        print_report(report, args.goal)
        return 0
    if not args.report_only:
        base = ensure_base_model(spec=DEMO_BASE_SPEC)
        args.out.mkdir(parents=True, exist_ok=True)
        measure(
            args.out,
            scenarios,
            [int(s) for s in args.seeds.split(",")],
            methods,
            fixed=not args.no_fixed,
            base_folder=base,
            jobs=args.jobs,
            progress=True,
            log=lambda m: print(m, flush=True),
        )
    report = write_report(args.out, args.json or args.out / "report.json", fixed_from)
    print_report(report, args.goal)
    return 0


def print_report(report: dict, goals: list[str]) -> None:
    print(markdown(report))
    for method in goals:
        print("\n" + goal_markdown(report, method))


if __name__ == "__main__":
    sys.exit(main())
