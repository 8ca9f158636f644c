"""``dynamics run CONFIG.yaml [--out DIR] [key=value ...]``: one fine-tuning run."""

from __future__ import annotations

import argparse
import json

HELP = "fine-tune a model on a dynamic (or fixed) data mixture from a YAML config"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="run config (YAML); see docs/config.md")
    parser.add_argument("--out", help="run folder (overrides output_dir); must be new or empty")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. training.total_steps=256 method.name=fixed",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    # Imported here so that other commands never pay for torch and transformers.
    from dynamics.cli import UsageError
    from dynamics.engine.config import ConfigError, RunConfig
    from dynamics.runs.rundir import RunDirError

    overrides = list(args.overrides)
    if args.out:
        overrides.append(f"output_dir={args.out}")
    try:
        config = RunConfig.from_yaml(args.config, overrides)
    except ConfigError as err:
        raise UsageError(str(err)) from None

    from dynamics.data.loading import DataError
    from dynamics.engine.run import RunSetupError, run

    try:
        summary = run(config, progress=not args.no_progress)
    except (RunDirError, DataError, RunSetupError) as err:
        raise UsageError(str(err)) from None
    print(json.dumps({k: summary[k] for k in ("feasible", "constrained_ppl_reduction", "best_checkpoint", "wall_seconds")}, indent=2))
    print(f"run folder: {config.output_dir}")
    return 0
