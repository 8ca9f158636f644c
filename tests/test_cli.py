"""The CLI's command table, its help and the README stay in sync."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dynamics.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_every_command_is_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    for name in COMMANDS:
        assert f"dynamics {name}" in readme, f"README.md does not show `dynamics {name}`"


def test_every_command_builds_its_parser():
    parser = build_parser()
    for name in COMMANDS:
        args = {
            "solve": ["x.json"],
            "run": ["c.yaml"],
            "report": ["r"],
            "scenarios": ["list"],
            "sweep": ["s.yaml", "--out", "o"],
            "push": ["r", "my-org/my-model"],
            "eval": ["r", "--tasks", "t"],
        }.get(name, [])
        assert parser.parse_known_args([name, *args])[0].command == name


def test_help_does_not_import_torch():
    code = (
        "import sys; from dynamics.cli import build_parser; build_parser(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_overrides_must_look_like_key_value(capsys):
    from dynamics.cli import main

    try:
        main(["solve", "x.json", "stray"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("a stray argument must be a usage error")
