"""``dynamics solve PROBLEM.json``: solve one mixture update offline and print the result.

The problem file holds what the controller logs at an update (docs/method.md, "The run folder")::

    {
      "slopes": [[...], ...],            # S(t), M rows of N numbers (metric change per step)
      "current_losses": [...],           # L_i(theta_t), M numbers
      "reference_losses": [..., null],   # L_i^ref, M entries, null where i is not a constraint
      "targets": [0],                    # indices of target domains T
      "constraints": [1, 2],             # indices of constrained domains C
      "horizon": 64,                     # H_t, steps until the next update
      "grid": {"lambdas": [...], "epsilons": [...]},  # optional, default: appendix G
      "min_weight": 0.05                 # optional, default 0: the least weight of every dataset
    }

The output is the JSON of :meth:`dynamics.core.solver.Solution.to_dict`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np

from dynamics.commands.errors import UsageError
from dynamics.core.problem import MixtureProblem, SolverGrid

HELP = "Solve one mixture update (eq. 3.4 over the lambda x eps grid) from a JSON problem file."

_REQUIRED_KEYS = (
    "slopes",
    "current_losses",
    "reference_losses",
    "targets",
    "constraints",
    "horizon",
)
_OPTIONAL_KEYS = ("grid", "min_weight")
_GRID_KEYS = ("lambdas", "epsilons")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "problem",
        metavar="PROBLEM.json",
        help="problem file (keys: "
        + ", ".join(_REQUIRED_KEYS)
        + "; optional: grid, min_weight); '-' reads stdin",
    )


def _read_json(path: str) -> Any:
    name = "stdin" if path == "-" else repr(path)
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as err:
        raise UsageError(
            f"cannot read problem file {name}: {err.strerror}; "
            "pass the path of a JSON problem file or '-' for stdin"
        ) from None
    except UnicodeDecodeError:
        raise UsageError(
            f"problem file {name} is not UTF-8 text; pass a JSON problem file"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(
            f"problem file {name} is not valid JSON "
            f"({err.msg} at line {err.lineno} column {err.colno}); fix the syntax"
        ) from None


def _is_number(x: Any) -> bool:
    # JSON true/false arrive as bools, which Python counts as ints; a 400-digit integer
    # literal is an int that no float can hold.
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def _numbers(
    value: Any, field: str, length: int | None = None, allow_null: bool = False
) -> list[Any]:
    kind = "finite numbers or null" if allow_null else "finite numbers"
    expected = f"a list of {length} {kind}" if length is not None else f"a non-empty list of {kind}"
    if not isinstance(value, list) or not value or (length is not None and len(value) != length):
        got = f"a list of {len(value)}" if isinstance(value, list) else type(value).__name__
        raise UsageError(f"'{field}' must be {expected}, got {got}")
    for k, x in enumerate(value):
        if not (_is_number(x) or (allow_null and x is None)):
            raise UsageError(
                f"'{field}[{k}]' must be a finite number{' or null' if allow_null else ''}, "
                f"got {x!r}"
            )
    return value


def _indices(value: Any, field: str, num_domains: int) -> list[int]:
    if not isinstance(value, list):
        raise UsageError(
            f"'{field}' must be a list of domain indices in [0, {num_domains - 1}], "
            f"got {type(value).__name__}"
        )
    for k, i in enumerate(value):
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < num_domains:
            raise UsageError(
                f"'{field}[{k}]' must be a domain index in [0, {num_domains - 1}] "
                f"(a row of slopes), got {i!r}"
            )
    if len(set(value)) != len(value):
        raise UsageError(f"'{field}' lists an index twice; list each domain once")
    return value


def _grid(value: Any) -> SolverGrid:
    if not isinstance(value, dict):
        raise UsageError(
            f"'grid' must be an object with keys {list(_GRID_KEYS)}, got {type(value).__name__}"
        )
    unknown = sorted(set(value) - set(_GRID_KEYS))
    if unknown:
        raise UsageError(f"unknown key 'grid.{unknown[0]}'; allowed keys are {list(_GRID_KEYS)}")
    defaults = SolverGrid()
    lambdas = _numbers(value.get("lambdas", list(defaults.lambdas)), "grid.lambdas")
    epsilons = _numbers(value.get("epsilons", list(defaults.epsilons)), "grid.epsilons")
    if any(x <= 0 for x in lambdas):
        raise UsageError("'grid.lambdas' must all be > 0 (penalty strengths)")
    if any(x < 0 for x in epsilons):
        raise UsageError("'grid.epsilons' must all be >= 0 (safety margins in loss units)")
    return SolverGrid(
        lambdas=tuple(float(x) for x in lambdas), epsilons=tuple(float(x) for x in epsilons)
    )


def load_problem(data: Any) -> MixtureProblem:
    """Validate the parsed JSON of a problem file and build the MixtureProblem.

    Every error names the offending field and says how to fix it.
    """
    if not isinstance(data, dict):
        raise UsageError(
            f"the problem file must hold a JSON object with keys {list(_REQUIRED_KEYS)}, "
            f"got {type(data).__name__}"
        )
    unknown = sorted(set(data) - set(_REQUIRED_KEYS) - set(_OPTIONAL_KEYS))
    if unknown:
        raise UsageError(
            f"unknown key '{unknown[0]}'; allowed keys are {[*_REQUIRED_KEYS, *_OPTIONAL_KEYS]}"
        )
    missing = [k for k in _REQUIRED_KEYS if k not in data]
    if missing:
        raise UsageError(f"missing key '{missing[0]}'; a problem file needs {list(_REQUIRED_KEYS)}")

    slopes = data["slopes"]
    if not isinstance(slopes, list) or not slopes:
        raise UsageError("'slopes' must be a non-empty list of rows (M rows of N numbers)")
    num_datasets = len(slopes[0]) if isinstance(slopes[0], list) else 0
    for i, row in enumerate(slopes):
        _numbers(row, f"slopes[{i}]", length=num_datasets or None)
    num_domains = len(slopes)

    current = _numbers(data["current_losses"], "current_losses", num_domains)
    reference = _numbers(data["reference_losses"], "reference_losses", num_domains, allow_null=True)
    targets = _indices(data["targets"], "targets", num_domains)
    constraints = _indices(data["constraints"], "constraints", num_domains)
    if not targets:
        raise UsageError("'targets' is empty; name at least one target domain (a row of slopes)")
    both = sorted(set(targets) & set(constraints))
    if both:
        raise UsageError(
            f"domain {both[0]} is in both 'targets' and 'constraints'; put it in one of them"
        )
    for i in constraints:
        if reference[i] is None:
            raise UsageError(
                f"'reference_losses[{i}]' is null but domain {i} is a constraint; "
                "give its reference loss (the base model's)"
            )
    horizon = data["horizon"]
    if not _is_number(horizon) or horizon <= 0:
        raise UsageError(f"'horizon' must be a positive number of steps, got {horizon!r}")

    grid = _grid(data["grid"]) if "grid" in data else SolverGrid()
    min_weight = data.get("min_weight", 0.0)
    if not _is_number(min_weight) or not (min_weight >= 0 and num_datasets * min_weight <= 1):
        raise UsageError(
            f"'min_weight' must be a number in [0, 1/N] = [0, {1 / num_datasets:g}] for "
            f"N = {num_datasets} datasets "
            f"(the least weight of every dataset, method.floors.all), got {min_weight!r}"
        )
    try:
        return MixtureProblem(
            slopes=np.array(slopes, dtype=float),
            current_losses=np.array(current, dtype=float),
            reference_losses=np.array(
                [math.nan if x is None else x for x in reference], dtype=float
            ),
            targets=tuple(targets),
            constraints=tuple(constraints),
            horizon=float(horizon),
            grid=grid,
            min_weight=float(min_weight),
        )
    except ValueError as err:  # anything the checks above missed, in MixtureProblem's words
        raise UsageError(f"invalid problem: {err}") from None


def main(args: argparse.Namespace) -> int:
    # Imported here: scipy.optimize takes ~0.3 s to import, and the CLI imports every
    # command module to build its parser, so `dynamics --help` would pay for it.
    from dynamics.core.solver import solve

    problem = load_problem(_read_json(args.problem))
    print(json.dumps(solve(problem).to_dict(), indent=2))
    return 0
