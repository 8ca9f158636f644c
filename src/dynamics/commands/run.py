"""``dynamics run CONFIG.yaml [--out DIR] [key=value ...]``: one fine-tuning run.

``dynamics run --scenario paper/s28 [--data-root DIR] [key=value ...]`` runs one of the
paper's scenarios with the paper's settings (``dynamics scenarios config`` prints them).

``dynamics run CONFIG.yaml --out DIR --resume`` (or ``dynamics run --resume DIR``, which
reads ``DIR/config.yaml``) continues a run that stopped, from its last resume point.
"""

from __future__ import annotations

import argparse
import json
import sys

from dynamics.commands.scenarios import add_data_root_argument

HELP = "fine-tune a model on a dynamic (or fixed) data mixture from a YAML config"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="run config (YAML); see docs/config.md")
    parser.add_argument(
        "--scenario",
        metavar="NAME",
        help="run one of the paper's scenarios (e.g. paper/s28) instead of a config file; "
        "any field can be overridden with key=value",
    )
    add_data_root_argument(parser)
    parser.add_argument("--out", help="run folder (overrides output_dir); must be new or empty")
    parser.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="DIR",
        help="continue a stopped run from its last_checkpoint/: the run folder DIR alone, "
        "or CONFIG --out DIR --resume",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. training.total_steps=256 method.name=fixed",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    # Imported here so that other commands never pay for torch and transformers.
    from pathlib import Path

    from dynamics.commands.errors import UsageError
    from dynamics.engine.config import ConfigError, RunConfig
    from dynamics.runs.rundir import RunDirError

    overrides = list(args.overrides)
    config_path = args.config
    if (
        args.scenario is not None
        and config_path is not None
        and "=" in config_path
        and not Path(config_path).is_file()
    ):
        # "--scenario NAME key=value ...": argparse took the first override for the config file.
        overrides.insert(0, config_path)
        config_path = None
    if isinstance(args.resume, str) and "=" in args.resume and not Path(args.resume).is_dir():
        # "CONFIG --resume key=value": argparse took the override for --resume's folder.
        overrides.append(args.resume)
        args.resume = True
    if isinstance(args.resume, str):
        if config_path is not None or args.out:
            raise UsageError(
                "give either --resume DIR alone or CONFIG --out DIR --resume, not both"
            )
        config_path = str(Path(args.resume) / "config.yaml")
        overrides.append(f"output_dir={args.resume}")
        if not Path(config_path).is_file():
            raise UsageError(
                f"{config_path} is missing: --resume DIR needs a run folder made by dynamics run"
            )
    elif config_path is None and args.scenario is None:
        raise UsageError(
            "give a run config (dynamics run CONFIG.yaml), a scenario (--scenario paper/s28) "
            "or a run folder to resume (--resume DIR)"
        )
    if args.scenario is not None and config_path is not None:
        raise UsageError("give either a run config or --scenario, not both")
    if args.data_root is not None and args.scenario is None:
        raise UsageError(
            "--data-root points a --scenario's datasets at local files; a run config names its own"
        )
    if args.out:
        overrides.append(f"output_dir={args.out}")
    if args.scenario is not None:
        from dynamics.commands.scenarios import build_scenario_config

        config = build_scenario_config(args.scenario, overrides, args.data_root)
    else:
        try:
            config = RunConfig.from_yaml(config_path, overrides)
        except ConfigError as err:
            raise UsageError(str(err)) from None

    from dynamics.data.loading import DataError
    from dynamics.engine.launch import is_main_process
    from dynamics.engine.run import RunSetupError, run
    from dynamics.runs.rundir import SUMMARY_FILE, RunStopped

    resume = bool(args.resume)
    if resume and (Path(config.output_dir) / SUMMARY_FILE).is_file():
        print(f"run {config.output_dir} already finished: nothing to resume")
        return 0
    from dynamics.core.learner import Diverged

    try:
        summary = run(config, progress=not args.no_progress, resume=resume)
    except (RunDirError, DataError, RunSetupError) as err:
        raise UsageError(str(err)) from None
    except (Diverged, RunStopped) as err:
        # Not bad input: the run folder keeps what was trained and logged up to here.
        print(f"dynamics run: error: {err}", file=sys.stderr)
        return 1
    if is_main_process():  # under torchrun, once
        keys = ("feasible", "constrained_ppl_reduction", "best_checkpoint", "wall_seconds")
        print(json.dumps({k: summary[k] for k in keys}, indent=2))
        print(f"run folder: {config.output_dir}")
    return 0
