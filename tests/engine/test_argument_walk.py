"""The run's configuration as one layer: validated at the edge, and below it each part of a
run receives the sections it uses. ``scripts/argument_walk.py`` measures how often a reader
following the configuration from ``dynamics run`` to the first mixture update comes back to
a file already read."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

from dynamics.engine import components, preflight, run_data
from dynamics.engine.config import RunConfig

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "argument_walk.py"


def _walk_module():
    spec = importlib.util.spec_from_file_location("argument_walk", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def _functions_taking_the_whole_config(module) -> list[str]:
    return sorted(
        name
        for name, function in inspect.getmembers(module, inspect.isfunction)
        if function.__module__ == module.__name__
        and any(
            parameter.annotation in (RunConfig, "RunConfig")
            for parameter in inspect.signature(function).parameters.values()
        )
    )


def test_preflight_reads_the_whole_config_in_one_function_only():
    assert _functions_taking_the_whole_config(preflight) == ["preflight"]


def test_the_data_and_the_learners_view_are_built_from_their_own_sections():
    assert _functions_taking_the_whole_config(run_data) == []
    # build_run assembles the parts from the config; build_policy reads the method and
    # the number of steps.
    assert _functions_taking_the_whole_config(components) == ["build_policy", "build_run"]


def test_the_walk_counts_stops_files_and_returns():
    walk = _walk_module().Walk()
    for file, function in [
        ("a.py", "f"),
        ("a.py", "g"),
        ("b.py", "h"),
        ("a.py", "f"),
        ("c.py", "k"),
        ("b.py", "h"),
    ]:
        walk.add(file, function)
    assert [stop.file for stop in walk.stops] == ["a.py", "b.py", "a.py", "c.py", "b.py"]
    assert walk.stops[0].functions == ["f", "g"]
    assert (len(walk.stops), len(walk.files), walk.returns) == (5, 3, 2)


def test_a_reader_following_the_config_of_a_run_returns_to_a_file_at_most_ten_times(tmp_path):
    walk = _walk_module().walk_tiny_run(tmp_path)
    assert walk.returns <= 10, walk.as_dict()
    files = [stop.file for stop in walk.stops]
    # From the validation at the edge, through the checks and the set-up, to the run folder.
    assert files[0] == "dynamics/engine/config_sections.py"
    assert "dynamics/engine/preflight.py" in files
    assert files[-1] == "dynamics/engine/run_folder.py"
