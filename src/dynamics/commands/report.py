"""``dynamics report RUN_DIR [--json]``: what a finished run did, from its files."""

from __future__ import annotations

import argparse
import json

HELP = "summarise a run folder: losses, constraint slack, weights, best feasible checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a folder written by 'dynamics run'")
    parser.add_argument("--json", action="store_true", help="print summary.json instead")


def main(args: argparse.Namespace) -> int:
    from dynamics.cli import UsageError
    from dynamics.report.text import run_report
    from dynamics.runs.rundir import RunDirError, read_run

    try:
        records = read_run(args.run_dir)
    except RunDirError as err:
        raise UsageError(str(err)) from None
    print(json.dumps(records.summary, indent=2) if args.json else run_report(records))
    return 0
