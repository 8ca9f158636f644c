"""``dynamics sweep SWEEP.yaml --out DIR``: configs or scenarios x methods x seeds, one run
folder each, on Ray (locally, or on a cluster with ``--address``); see docs/sweeps.md."""

from __future__ import annotations

import argparse

HELP = (
    "run a sweep (configs or scenarios x methods x seeds) as Ray tasks; complete runs are skipped"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", help="sweep file (YAML); see docs/sweeps.md")
    parser.add_argument(
        "--out", required=True, help="sweep folder: one run folder per run, and sweep.json"
    )
    parser.add_argument(
        "--address",
        help="a running Ray cluster ('auto' on one of its nodes, or ray://host:10001); "
        "default: a local Ray",
    )
    parser.add_argument(
        "--num-cpus", type=int, help="CPU cores of the local Ray instance (default: all)"
    )
    parser.add_argument(
        "--no-ray",
        action="store_true",
        help="run one after another in this process even when Ray is installed, "
        "on whatever devices it sees",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list the runs and their status, train nothing"
    )


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dynamics.commands.errors import UsageError
    from dynamics.experiments.sweep import SweepError, plan_sweep, read_sweep_file, run_sweep

    if args.no_ray and (args.address or args.num_cpus):
        raise UsageError("--address and --num-cpus are Ray's; remove --no-ray")
    if args.address and args.num_cpus:
        raise UsageError(
            "--num-cpus sizes a local Ray instance; a cluster (--address) has its own cores"
        )
    out = Path(args.out)
    try:
        sweep = read_sweep_file(args.sweep)
        sweep_dir = Path(args.sweep).parent
        if args.dry_run:
            plan = plan_sweep(sweep, out, sweep_dir)
            for note in plan.notes:
                print(f"note: {note}")
            for planned in plan.runs:
                print(f"{planned.status():<11} {planned.name}  ->  {planned.path}")
            return 0
        record = run_sweep(
            sweep,
            out,
            sweep_dir=sweep_dir,
            use_ray=False if args.no_ray else None,
            address=args.address,
            num_cpus=args.num_cpus,
        )
    except SweepError as err:
        raise UsageError(str(err)) from None
    print(f"sweep folder: {out}; report: dynamics report {out} --out {out}/report")
    return 1 if any(row["status"] == "failed" for row in record["runs"]) else 0
