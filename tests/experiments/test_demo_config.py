"""The demo's run config: what its settings become (no training)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dynamics.commands import demo as demo_command
from dynamics.experiments.demo import DemoSettings, available_cores, demo_config

FILES = (
    "arithmetic",
    "toolcall",
    "code",
    "prose",
    "facts",
    "code-heldout",
    "prose-heldout",
    "quiz",
)


def test_the_demo_seed_draws_the_data_order_the_splits_and_the_sampling(tmp_path: Path) -> None:
    files = {name: tmp_path / f"{name}.jsonl" for name in FILES}
    for seed in (0, 3):
        training = demo_config(tmp_path, files, tmp_path / "out", DemoSettings(seed=seed))[
            "training"
        ]
        assert (training["seed"], training["data_seed"]) == (seed, seed)


def test_dynamics_demo_takes_a_seed() -> None:
    parser = argparse.ArgumentParser()
    demo_command.add_arguments(parser)
    assert parser.parse_args([]).seed == 0
    assert parser.parse_args(["--seed", "2"]).seed == 2


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("200000 100000\n", 2),
        ("150000 100000\n", 2),
        ("50000 100000\n", 1),
        ("max 100000\n", None),
        ("", None),
    ],
)
def test_demo_jobs_stay_within_a_containers_cpu_quota(tmp_path, cpu_max: str, expected: int | None):
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = tmp_path / "cpu.max"
    quota.write_text(cpu_max)
    assert available_cores(quota) == (cores if expected is None else min(cores, expected))
    assert available_cores(tmp_path / "absent") == cores  # no cgroup v2 file: the pinned cores
