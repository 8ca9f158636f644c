"""Golden records: what the tiny runs write into ``metrics.jsonl`` and ``controller.jsonl``,
byte for byte (wall times left out), for the paper and robust variants, a backtracking run,
a run stopped and resumed, and a run driven by a transformers Trainer with the callback.

A change of the loop, the drivers or the learner that is meant to leave behaviour alone
must leave these files alone. A change meant to alter behaviour regenerates them:

    DYNAMICS_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/integrations/test_golden_records.py

and the diff of ``tests/fixtures/golden/`` shows what it altered. Every key, string and
count must match exactly and every number to a relative 1e-6 (absolute 1e-9 near zero).
The runs are in float64 (``model.dtype``): in float32, CPUs with other vector instructions
(AVX2, AVX-512) round the same sums differently, Adam's steps grow those last digits, and a
run at a high learning rate ends elsewhere; in float64 they agree within 1e-6 on both. One
thread, so that sums are reduced in the same order on every machine.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from threadpoolctl import threadpool_limits

from dynamics.engine import learner as engine_learner
from dynamics.engine.config import RunConfig
from dynamics.engine.run import run
from tests.engine.test_run import tiny_config
from tests.integrations.test_trainer import train_with_callback

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
WRITE = os.environ.get("DYNAMICS_WRITE_GOLDEN") == "1"


def stripped(path: Path) -> str:
    """The JSON lines of ``path`` without their wall times, keys sorted."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in sorted(value.items()) if not k.endswith("seconds")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return "".join(
        json.dumps(strip(json.loads(line)), sort_keys=True) + "\n"
        for line in path.read_text().splitlines()
    )


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # torch's threads and the BLAS/OpenMP threads scipy's solvers use: SLSQP's answer moves
    # in its last digits with their number.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        yield
    torch.set_num_threads(threads)


def float64_config(tokenizer_dir: Path, out: Path, **method) -> dict:
    """The tiny run of ``tests/engine/test_run.py`` in float64."""
    data = tiny_config(tokenizer_dir, out, **method)
    data["model"]["dtype"] = "float64"
    return data


def paper(tokenizer_dir: Path, out: Path) -> None:
    run(RunConfig.from_dict(float64_config(tokenizer_dir, out, variant="paper")), progress=False)


def robust(tokenizer_dir: Path, out: Path) -> None:
    run(RunConfig.from_dict(float64_config(tokenizer_dir, out, variant="robust")), progress=False)


def backtrack(tokenizer_dir: Path, out: Path) -> None:
    data = float64_config(tokenizer_dir, out, variant="paper", backtrack=1)
    data["optimizer"]["lr"] = 1.0  # breaks the orca constraint after step 4 (see test_run)
    run(RunConfig.from_dict(data), progress=False)


class Stop(Exception):
    pass


def resumed(tokenizer_dir: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Robust with backtracking and a resume point every 2 steps, stopped in its fifth
    stretch of training and resumed from its last resume point."""
    data = float64_config(tokenizer_dir, out, variant="robust", backtrack=1)
    data["method"]["schedule"] = [0, 2, 4, 8]
    data["training"].update(total_steps=12, checkpoint_interval=2)
    config = RunConfig.from_dict(data)
    train = engine_learner.HFLearner.train
    calls = {"n": 0}

    def stopping(self, steps, weights):
        calls["n"] += 1
        if calls["n"] == 5:
            raise Stop
        return train(self, steps, weights)

    with monkeypatch.context() as patch:
        patch.setattr(engine_learner.HFLearner, "train", stopping)
        with pytest.raises(Stop):
            run(config, progress=False)
    assert not (out / "summary.json").exists() and (out / "last_checkpoint").is_dir()
    run(config, progress=False, resume=True)


def trainer(tokenizer_dir: Path, out: Path) -> None:
    train_with_callback(
        RunConfig.from_dict(float64_config(tokenizer_dir, out, variant="paper")),
        out.parent / f"{out.name}-hf",
    )


CASES: dict[str, Callable[..., None]] = {
    "paper": paper,
    "robust": robust,
    "backtrack": backtrack,
    "resumed": resumed,
    "trainer": trainer,
}


@pytest.mark.parametrize("case", list(CASES))
def test_run_files_match_the_golden_records(
    case: str, tokenizer_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    out = tmp_path / case
    make = CASES[case]
    if case == "resumed":
        make(tokenizer_dir, out, monkeypatch)
    else:
        make(tokenizer_dir, out)
    for name in ("metrics.jsonl", "controller.jsonl"):
        written = stripped(out / name)
        golden = GOLDEN / case / name
        if WRITE:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(written)
        differences = list(
            _differences(_records(written), _records(golden.read_text()), f"{case}/{name}")
        )
        assert not differences, f"{case}/{name} differs from its golden record: " + "; ".join(
            differences[:5]
        )


def _records(text: str) -> list:
    return [json.loads(line) for line in text.splitlines()]


def _differences(written, golden, where: str) -> Iterator[str]:
    """Where ``written`` departs from ``golden``: any key, string, flag or length, or a
    number beyond a relative 1e-6 (absolute 1e-9)."""
    if isinstance(golden, dict) and isinstance(written, dict):
        if set(written) != set(golden):
            yield f"{where}: keys {sorted(set(written) ^ set(golden))} only on one side"
            return
        for key in golden:
            yield from _differences(written[key], golden[key], f"{where}.{key}")
    elif isinstance(golden, list) and isinstance(written, list):
        if len(written) != len(golden):
            yield f"{where}: {len(written)} entries, golden {len(golden)}"
            return
        for k, (w, g) in enumerate(zip(written, golden, strict=True)):
            yield from _differences(w, g, f"{where}[{k}]")
    elif _is_number(golden) and _is_number(written):
        if not math.isclose(written, golden, rel_tol=1e-6, abs_tol=1e-9):
            yield f"{where}: {written!r}, golden {golden!r}"
    elif written != golden or type(written) is not type(golden):
        yield f"{where}: {written!r}, golden {golden!r}"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
