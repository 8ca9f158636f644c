"""The ``dynamics`` command line: one subcommand, one module in ``dynamics.commands``.

Each command module exposes ``HELP`` (one line), ``add_arguments(parser)`` and
``main(args) -> int``. Modules are imported lazily so ``dynamics solve`` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from dynamics.commands.errors import UsageError

# Command name -> module under dynamics.commands. A test keeps this in sync with the README.
COMMANDS: dict[str, str] = {
    "solve": "dynamics.commands.solve",
    "cost": "dynamics.commands.cost",
    "scenarios": "dynamics.commands.scenarios",
    "run": "dynamics.commands.run",
    "sweep": "dynamics.commands.sweep",
    "report": "dynamics.commands.report",
    "eval": "dynamics.commands.eval",
    "push": "dynamics.commands.push",
    "demo": "dynamics.commands.demo",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynamics",
        description="Fine-tune language models on a dynamic data mixture "
        "under performance constraints.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command_parser)
        command_parser.set_defaults(_main=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # key=value overrides may come before or after options (argparse alone would stop
    # collecting positionals at the first option), so they are gathered from the leftovers.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any("=" not in e or e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    try:
        return int(args._main(args))
    except UsageError as err:
        print(f"dynamics {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
