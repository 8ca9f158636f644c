"""``dynamics demo [--out DIR] [--quick] [--seed N] [--jobs N] [--pretrain]``: the offline
end-to-end demonstration."""

from __future__ import annotations

import argparse
from datetime import datetime

HELP = "offline demo: DynaMiCS against the fixed-mixture sweep on a tiny pretrained model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", help="output folder (default: runs/demo-<time>)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="DynaMiCS (the default variant only, without the paper's method as reference) "
        "and two fixed mixtures: w = 0.05 (the seed-0 sweep's best) and w = 0.2",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the data order, the splits and the mixture sampling "
        "(the base model is the same)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="runs trained at once, each in its own process on one thread (default: the CPU cores "
        "available); the numbers are the same for any value",
    )
    parser.add_argument(
        "--pretrain",
        action="store_true",
        help="pretrain the base model on this machine (about 7 minutes on 2 cores, cached) "
        "instead of installing the weights shipped with dynamics; another CPU pretrains another "
        "model, so the numbers then differ from README's",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dynamics.commands.errors import UsageError
    from dynamics.experiments.demo import DemoSettings, available_cores, run_demo
    from dynamics.runs.rundir import RunDirError

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1 (got {args.jobs})")
    out = Path(args.out or f"runs/demo-{datetime.now():%Y%m%d-%H%M%S}")
    try:
        settings = DemoSettings(
            quick=args.quick,
            paper_reference=not args.quick,
            seed=args.seed,
            pretrain_base=args.pretrain,
        )
        result = run_demo(
            out, settings, progress=not args.no_progress, jobs=args.jobs or available_cores()
        )
    except RunDirError as err:
        raise UsageError(str(err)) from None
    print()
    print((out / "table.txt").read_text())
    print(result["verdict"])
    print(f"report: {result['report']}")
    return 0
