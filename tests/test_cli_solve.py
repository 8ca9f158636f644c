"""``dynamics solve PROBLEM.json``: output, and one-line errors with exit code 2 on bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dynamics import cli
from dynamics.core.problem import MixtureProblem, SolverGrid
from dynamics.core.solver import solve

OUTPUT_KEYS = {
    "weights", "objective", "lambda", "eps", "predicted_losses", "feasible", "max_violation",
    "lp_feasible", "lp_weights",
}  # fmt: skip

# Two datasets, one target helped by dataset 0, one constraint that dataset 0 hurts.
PROBLEM: dict[str, Any] = {
    "slopes": [[-2e-3, -5e-4], [1e-3, -1e-4]],
    "current_losses": [2.5, 1.8],
    "reference_losses": [None, 1.82],
    "targets": [0],
    "constraints": [1],
    "horizon": 64,
}


@pytest.fixture(autouse=True)
def only_the_solve_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Build the parser with this command alone, so these tests do not depend on others'."""
    monkeypatch.setattr(cli, "COMMANDS", {"solve": cli.COMMANDS["solve"]})


def write(tmp_path: Path, data: Any) -> str:
    path = tmp_path / "problem.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_solve_prints_the_solution(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["solve", write(tmp_path, PROBLEM)], capsys)
    assert code == 0 and err == ""
    result = json.loads(out)
    assert OUTPUT_KEYS <= set(result)
    expected = solve(
        MixtureProblem(
            np.array(PROBLEM["slopes"]),
            np.array(PROBLEM["current_losses"]),
            np.array([np.nan, 1.82]),
            (0,),
            (1,),
            64.0,
        )
    ).to_dict()
    assert result == expected  # JSON floats round-trip exactly
    # The target wants dataset 0; the constraint, L_hat_1 = 1.8 + 64 (1.1e-3 w_0 - 1e-4) <= 1.82,
    # caps it at w_0 = 0.375, the LP optimum. The grid cannot reach that boundary: eps = 0
    # candidates stop ~1e-2 / lambda past it (infeasible), and eps >= 0.05 exceeds the
    # constraint's 0.02 slack, so those candidates put all weight on dataset 1.
    assert result["lp_feasible"]
    assert result["lp_weights"] == pytest.approx([0.375, 0.625], abs=1e-7)
    assert result["feasible"] and result["eps"] > 0
    assert result["weights"] == [0.0, 1.0]


def test_solve_reads_stdin_and_a_custom_grid(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = {**PROBLEM, "grid": {"lambdas": [10, 100], "epsilons": [0]}}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(data)))
    code, out, _ = run(["solve", "-"], capsys)
    result = json.loads(out)
    assert code == 0
    assert result["lambda"] in (10.0, 100.0) and result["eps"] == 0.0
    assert result["num_candidates"] == 2


def test_grid_defaults_fill_a_missing_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["solve", write(tmp_path, {**PROBLEM, "grid": {"epsilons": [0.0]}})], capsys)
    assert code == 0
    assert json.loads(out)["num_candidates"] == len(SolverGrid().lambdas)


def test_min_weight_holds_every_dataset_at_the_floor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Without a floor every grid candidate puts all weight on dataset 1 (the test above);
    # with min_weight 0.2 dataset 0 keeps 0.2, which the constraint allows (w_0 <= 0.375).
    code, out, _ = run(["solve", write(tmp_path, {**PROBLEM, "min_weight": 0.2})], capsys)
    result = json.loads(out)
    assert code == 0
    assert result["min_weight"] == 0.2
    assert min(result["weights"]) >= 0.2 - 1e-12 and min(result["lp_weights"]) >= 0.2 - 1e-12
    assert result["weights"] == pytest.approx([0.2, 0.8], abs=1e-9)
    assert result["lp_weights"] == pytest.approx([0.375, 0.625], abs=1e-7)


BAD_INPUTS = [
    ("not json", "{", "not valid JSON"),
    ("not an object", [1, 2], "JSON object"),
    ("unknown key", {**PROBLEM, "horizn": 3}, "unknown key 'horizn'"),
    ("unknown grid key", {**PROBLEM, "grid": {"lambda": [1]}}, "unknown key 'grid.lambda'"),
    (
        "missing field",
        {k: v for k, v in PROBLEM.items() if k != "horizon"},
        "missing key 'horizon'",
    ),
    (
        "ragged slopes",
        {**PROBLEM, "slopes": [[1e-3, 0.0], [1e-3]]},
        "'slopes[1]' must be a list of 2",
    ),
    ("empty slopes", {**PROBLEM, "slopes": []}, "'slopes'"),
    ("string slope", {**PROBLEM, "slopes": [[1e-3, "x"], [0.0, 0.0]]}, "'slopes[0][1]'"),
    ("bool slope", {**PROBLEM, "slopes": [[True, 0.0], [0.0, 0.0]]}, "'slopes[0][0]'"),
    ("short losses", {**PROBLEM, "current_losses": [2.5]}, "'current_losses' must be a list of 2"),
    ("null current loss", {**PROBLEM, "current_losses": [2.5, None]}, "'current_losses[1]'"),
    (
        "null reference of a constraint",
        {**PROBLEM, "reference_losses": [None, None]},
        "'reference_losses[1]' is null",
    ),
    (
        "target out of range",
        {**PROBLEM, "targets": [2]},
        "'targets[0]' must be a domain index in [0, 1]",
    ),
    ("no targets", {**PROBLEM, "targets": []}, "'targets' is empty"),
    (
        "repeated constraint",
        {**PROBLEM, "constraints": [1, 1]},
        "'constraints' lists an index twice",
    ),
    ("target and constraint", {**PROBLEM, "targets": [0, 1]}, "domain 1 is in both"),
    ("zero horizon", {**PROBLEM, "horizon": 0}, "'horizon' must be a positive number"),
    ("huge integer", json.dumps(PROBLEM).replace("-0.002", "1" + "0" * 400), "'slopes[0][0]'"),
    ("infinite loss", {**PROBLEM, "current_losses": [2.5, float("inf")]}, "'current_losses[1]'"),
    ("negative lambda", {**PROBLEM, "grid": {"lambdas": [-1.0]}}, "'grid.lambdas'"),
    ("empty eps grid", {**PROBLEM, "grid": {"epsilons": []}}, "'grid.epsilons'"),
    (
        "floor above 1/N",
        {**PROBLEM, "min_weight": 0.6},
        "'min_weight' must be a number in [0, 1/N] = [0, 0.5]",
    ),
    ("negative floor", {**PROBLEM, "min_weight": -0.1}, "'min_weight'"),
    ("string floor", {**PROBLEM, "min_weight": "0.1"}, "'min_weight'"),
]


@pytest.mark.parametrize(
    ("data", "message"), [(d, m) for _, d, m in BAD_INPUTS], ids=[i for i, _, _ in BAD_INPUTS]
)
def test_bad_input_is_one_line_naming_the_field(
    data: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["solve", write(tmp_path, data)], capsys)
    assert code == 2 and out == ""
    assert err.startswith("dynamics solve: error: ") and err.count("\n") == 1
    assert message in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["solve", str(tmp_path / "nope.json")], capsys)
    assert code == 2
    assert "cannot read problem file" in err and "No such file" in err and err.count("\n") == 1


def test_binary_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "problem.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    code, _, err = run(["solve", str(path)], capsys)
    assert code == 2 and "not UTF-8" in err and err.count("\n") == 1


def test_installed_entry_point(tmp_path: Path) -> None:
    """The console script, end to end in a fresh process (no monkeypatching there)."""
    script = Path(sys.executable).with_name("dynamics")
    if not script.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    ok = subprocess.run(
        [str(script), "solve", write(tmp_path, PROBLEM)], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0, ok.stderr
    assert OUTPUT_KEYS <= set(json.loads(ok.stdout))
    bad = subprocess.run(
        [str(script), "solve", "-"],
        input='{"slopes": 1}',
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert (
        bad.stderr.strip().startswith("dynamics solve: error: ")
        and len(bad.stderr.strip().splitlines()) == 1
    )
