"""The dependency ranges in pyproject.toml admit the exact set the tests run against."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
# Extras the CPU test set cannot install, so constraints.txt does not pin them.
GPU_EXTRAS = {"qlora"}


def pinned() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = Version(version)
    return pins


def test_every_range_admits_the_tested_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    for name, extra in project["optional-dependencies"].items():
        if name not in GPU_EXTRAS:
            requirements += [Requirement(r) for r in extra]
    pins = pinned()
    for requirement in requirements:
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is a dependency but not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject's {requirement}"
        )
    # torch is pinned exactly: a range alone would pull a CUDA build on a CPU machine.
    assert pins["torch"] == Version("2.13.0")
