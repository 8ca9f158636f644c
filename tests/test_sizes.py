"""Code a newcomer can hold in mind: in the packages at the centre (``core``, ``engine``,
``runs``, ``integrations``) no module is longer than 500 lines and no function longer than
80, measured with ``ast`` (nothing is imported)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "dynamics"
CENTRE = ("core", "engine", "runs", "integrations")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def modules() -> list[Path]:
    return sorted(path for package in CENTRE for path in (SRC / package).rglob("*.py"))


def test_the_centre_has_modules_to_measure() -> None:
    assert len(modules()) > 20


def test_no_module_at_the_centre_is_longer_than_500_lines() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these modules: {long}"


def test_no_function_at_the_centre_is_longer_than_80_lines() -> None:
    long = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(SRC)}:{node.name}"] = lines
    assert not long, f"split these functions: {long}"
