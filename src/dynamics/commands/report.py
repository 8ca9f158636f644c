"""``dynamics report RUN_DIR [--json]``: what a run did, from its files (a run still
training, or stopped, is reported up to its last complete evaluation).
``dynamics report PATH... --out REPORT_DIR``: figures, ``report.json`` and ``index.html``
for one run folder, or the paper's comparison of methods over the run folders of sweeps."""

from __future__ import annotations

import argparse
import json

HELP = "summarise a run folder, or draw the figures of runs and sweeps (--out)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="DIR",
        help="a folder written by 'dynamics run' (or, with --out, sweep folders)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print summary.json instead (one run folder)"
    )
    parser.add_argument(
        "--out", help="write index.html, report.json and the PNG figures into this folder"
    )


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dynamics.commands.errors import UsageError
    from dynamics.runs.rundir import RunDirError, read_run

    try:
        if args.out:
            if args.json:
                raise UsageError(
                    "--json prints one run's summary; with --out the numbers go to report.json"
                )
            from dynamics.report.html import write_report

            out = Path(args.out)
            report = write_report(args.paths, out)
            print(
                f"report: {out / 'index.html'} ({len(report['figures'])} figures; "
                f"numbers in {out / 'report.json'})"
            )
            return 0
        if len(args.paths) != 1:
            raise UsageError(
                "without --out, give one run folder; add --out REPORT_DIR to compare several"
            )
        from dynamics.report.text import run_report

        records = read_run(args.paths[0], unfinished=not args.json)
    except RunDirError as err:
        raise UsageError(str(err)) from None
    print(json.dumps(records.summary, indent=2) if args.json else run_report(records))
    return 0
