"""How often the checkpoint a run keeps holds its constraints on the test split, at each
checkpoint selection margin (``benchmarks/results/beyond-the-paper-notebook.md``, "A checkpoint that
clears its constraints by a margin").

    .venv/bin/python benchmarks/selection_margin.py --out runs/margin [--margins 0,1,2,3]
        [--json benchmarks/results/selection_margin.json]

Reads the finished DynaMiCS runs that ``benchmarks/beyond_the_paper.py --out`` trained (the
fixed sweep is left out) and replays the checkpoint choice at every margin from their
records: the margin changes no training decision. Runs recorded before the eval split's
per-batch values were kept cannot be replayed with a margin (an error says so). Prints the
table and writes ``--json`` (default ``<out>/selection_margin.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from dynamics.runs import rundir  # noqa: E402
from robustness import selection_margins, selection_margins_markdown  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="the folder beyond_the_paper.py trained into"
    )
    parser.add_argument(
        "--margins", default="0,1,2,3", help="selection margins, in standard errors"
    )
    parser.add_argument(
        "--json", type=Path, help="where the report goes (default: <out>/selection_margin.json)"
    )
    args = parser.parse_args(argv)
    try:
        margins = [float(m) for m in args.margins.split(",") if m]
    except ValueError:
        parser.error(f"--margins {args.margins!r}: give numbers separated by commas, e.g. 0,1,2,3")
    if not margins or min(margins) < 0:
        parser.error("--margins: give at least one margin, each >= 0")
    if not args.out.is_dir():
        parser.error(
            f"--out {args.out} is not a folder: "
            "train into it with benchmarks/beyond_the_paper.py first"
        )
    report = selection_margins(args.out, margins)
    if not report["methods"]:
        print(
            f"no finished run with constraints and a feasible checkpoint under {args.out}",
            file=sys.stderr,
        )
        return 1
    path = args.json or args.out / "selection_margin.json"
    rundir.atomic_write_text(path, json.dumps(report, indent=1) + "\n")
    print(selection_margins_markdown(report))
    print(f"\nreport: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
