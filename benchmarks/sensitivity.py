"""How far one run's outcome moves under perturbations of the size that separates two
machines or two builds (``benchmarks/results/beyond-the-paper-notebook.md``, "Sensitivity").

    .venv/bin/python benchmarks/sensitivity.py [--out runs/beyond] [--scenario demo] [--seed 0]
        [--methods paper,robust] [--perturbations evaluations-a,weights-a,kernels-default]
        [--report-only] [--fixed-from benchmarks/results/protocol.json ...]

Each method runs once per perturbation (evaluations x (1 + 1e-6 N(0, 1)), the base model's
weights x (1 + 1e-6 N(0, 1)), torch's CPU kernels without vector instructions) beside its
unperturbed run of the protocol under ``--out`` (run first if missing). Finished runs are
skipped, so the command resumes. Writes ``--json`` (default ``<out>/sensitivity.json``; the
committed results are ``benchmarks/results/sensitivity.json``) and prints
the table: the spread of each method's test reduction, against the spread across seeds of
the best fixed mixture where the protocol ran several seeds (under ``--out``, or else in the
earlier protocol reports of ``--fixed-from``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from dynamics.experiments.base_model import ensure_base_model  # noqa: E402
from dynamics.experiments.demo import DEMO_BASE_SPEC  # noqa: E402
from dynamics.runs import rundir  # noqa: E402
from robustness import (  # noqa: E402
    METHODS,
    PERTURBATIONS,
    SCENARIOS,
    aggregate_sensitivity,
    measure_sensitivity,
    read_reports,
    sensitivity_markdown,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "beyond")
    parser.add_argument("--scenario", default="demo", choices=sorted(SCENARIOS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default="paper,robust")
    parser.add_argument("--perturbations", default=",".join(PERTURBATIONS))
    parser.add_argument("--report-only", action="store_true", help="only aggregate finished runs")
    parser.add_argument(
        "--json", type=Path, help="where the report goes (default: <out>/sensitivity.json)"
    )
    parser.add_argument(
        "--fixed-from",
        type=Path,
        nargs="+",
        default=[],
        help="earlier protocol reports: "
        "the best fixed mixture's seed spread where --out has one seed",
    )
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    perturbations = [p for p in args.perturbations.split(",") if p]
    unknown = sorted(set(methods) - set(METHODS)) + sorted(set(perturbations) - set(PERTURBATIONS))
    if unknown:
        parser.error(
            f"unknown methods or perturbations {unknown}: use {sorted(METHODS)} and "
            f"{sorted(PERTURBATIONS)}"
        )
    try:
        fixed_from = read_reports(args.fixed_from)
    except FileNotFoundError as error:
        parser.error(f"--fixed-from: {error}")
    if not args.report_only:
        base = ensure_base_model(spec=DEMO_BASE_SPEC)
        args.out.mkdir(parents=True, exist_ok=True)
        measure_sensitivity(
            args.out,
            args.scenario,
            args.seed,
            methods,
            base_folder=base,
            perturbations=perturbations,
            log=lambda m: print(m, flush=True),
        )
    report = aggregate_sensitivity(args.out, fixed_from)
    rundir.atomic_write_text(
        args.json or args.out / "sensitivity.json", json.dumps(report, indent=1) + "\n"
    )
    print(sensitivity_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
