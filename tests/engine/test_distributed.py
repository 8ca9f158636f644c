"""Two CPU processes (gloo, one thread each; started by torchrun, or one by one) follow the
same weight trajectory as one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.engine.test_run import TINY_LLAMA
from tests.fixtures.in_process import cli_here
from tests.fixtures.preloaded import Child
from tests.fixtures.tiny_tokenizer import FIXTURES, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def config(tokenizer_dir: Path, out: Path, batch_size: int, split_probes: bool = True) -> dict:
    text = {"format": "text", "eval_size": 2, "test_size": 2}
    return {
        "model": {"init_config": TINY_LLAMA, "tokenizer": str(tokenizer_dir)},
        "lora": {"rank": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "optimizer": {"lr": 1e-2},
        # Packed text: every sequence has the same number of loss tokens, so the mean of
        # the two ranks' mean losses equals the one-process mean (DDP averages gradients).
        "training": {
            "total_steps": 6,
            "batch_size": batch_size,
            "sequence_length": 32,
            "packing": True,
            "split_probes": split_probes,
        },
        # Three batches over two ranks: rank 0 evaluates two, rank 1 one (none of the
        # single reduced batch), and the gathered values must equal one process's.
        "evaluation": {"interval": 3, "batches": 3, "reduced_batches": 1, "batch_size": 4},
        "method": {"name": "dynamics", "schedule": [0, 2, 4]},
        "datasets": [
            {"name": "wiki", "path": str(FIXTURES / "wikipedia.jsonl"), "role": "target", **text},
            {
                "name": "wikitxt",
                "path": str(FIXTURES / "wikipedia.txt"),
                "role": "non-target",
                **text,
            },
            {
                "name": "orca",
                "path": str(FIXTURES / "openorca.jsonl"),
                "role": "constraint",
                "format": "instruction",
                "columns": {"prompt": "question"},
            },
            # An accuracy constraint: its slopes come from the expected accuracy, which the
            # ranks must sum as they sum the measured values.
            {
                "name": "mmlu",
                "path": str(FIXTURES / "tinymmlu.jsonl"),
                "role": "constraint",
                "format": "multiple_choice",
                "metric": "accuracy",
                "eval_batch_size": 1,
            },
        ],
        "output_dir": str(out),
    }


def launch(
    tmp_path: Path,
    name: str,
    nproc: int,
    batch_size: int,
    tokenizer_dir: Path,
    split_probes: bool = True,
    torchrun: bool = False,
) -> list[dict]:
    """The run as one process (this one), or as ``nproc`` processes: started by torchrun in
    fresh interpreters, as the README runs it, or one by one as a cluster scheduler starts
    them (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set as torchrun sets them)."""
    path = tmp_path / f"{name}.yaml"
    out = tmp_path / name
    path.write_text(yaml.safe_dump(config(tokenizer_dir, out, batch_size, split_probes)))
    args = ["run", str(path), "--no-progress"]
    if nproc == 1:
        cli_here(*args)  # the reference, without a launcher
    elif torchrun:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "dynamics.cli",
            *args,
        ]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.count("run folder:") == 1  # the summary is printed once, not per rank
    else:
        ranks = start_ranks("dynamics.cli", args, nproc)
        finish(ranks, timeout=600, stop_on_failure=True)
        # The summary is printed once, by rank 0.
        assert [rank.stdout().count("run folder:") for rank in ranks] == [1] + [0] * (nproc - 1)
    return [json.loads(line) for line in (out / "controller.jsonl").read_text().splitlines()]


def evaluations(tmp_path: Path, name: str) -> list[dict]:
    return [
        json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    ]


def probe_streams(tmp_path: Path, name: str) -> list[dict]:
    """Where each probe stream stood at the last checkpoint (written by rank 0)."""
    meta = json.loads((tmp_path / name / "last_checkpoint" / "learner.json").read_text())
    return meta["sampler"]["probe_streams"]


def test_two_processes_match_one_process(tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"
    tiny_tokenizer().save_pretrained(tokenizer_dir)
    single = launch(tmp_path, "single", nproc=1, batch_size=4, tokenizer_dir=tokenizer_dir)
    # Two datasets over two ranks: each rank probes one dataset on its own.
    split = launch(
        tmp_path, "split", nproc=2, batch_size=2, tokenizer_dir=tokenizer_dir, torchrun=True
    )
    # Both ranks take part in both probes, as data-parallel training does.
    together = launch(
        tmp_path, "together", nproc=2, batch_size=2, tokenizer_dir=tokenizer_dir, split_probes=False
    )
    assert [u["probe_ranks"] for u in single] == [[[0], [0]]] * 3
    assert [u["probe_ranks"] for u in split] == [[[0], [1]]] * 3
    assert [u["probe_ranks"] for u in together] == [[[0, 1], [0, 1]]] * 3
    # The accuracy row is read from expected accuracies, and they moved: a rank's expected
    # values lost on the way would leave its dataset's entry at the anchor's (a zero slope).
    for run in (single, split, together):
        assert [u["extra"]["accuracy_slopes"] for u in run] == ["expected"] * 3
    assert all(np.all(np.array(u["slope_matrix"])[-1] != 0) for u in single)
    for name, double in (("split", split), ("together", together)):
        assert [u["step"] for u in single] == [u["step"] for u in double] == [0, 2, 4]
        for one, two in zip(single, double, strict=True):
            np.testing.assert_allclose(
                two["slope_matrix"], one["slope_matrix"], rtol=1e-3, atol=1e-5
            )
            np.testing.assert_allclose(two["weights"], one["weights"], atol=1e-4)
            np.testing.assert_allclose(two["current_losses"], one["current_losses"], rtol=1e-5)
            assert all(seconds > 0 for seconds in two["dataset_probe_seconds"])
        # Rank 0 probed only the first dataset, yet saves both streams where one process has them.
        assert probe_streams(tmp_path, name) == probe_streams(tmp_path, "single")
        for one, two in zip(
            evaluations(tmp_path, "single"), evaluations(tmp_path, name), strict=True
        ):
            for part in ("eval", "test"):
                np.testing.assert_allclose(
                    list(two[part].values()), list(one[part].values()), rtol=1e-5
                )


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_two_ranks(config_path: Path, timeout: float = 120) -> list[tuple[int, str]]:
    """``dynamics run`` as two processes started one by one, as a cluster scheduler starts
    them: no launcher stops the other ranks when one exits, so a rank left waiting for a
    collective would wait until the timeout. Returns each rank's exit code and stderr."""
    return run_ranks("dynamics.cli", ["run", str(config_path), "--no-progress"], timeout=timeout)


def start_ranks(module: str, args: list[str], nproc: int = 2) -> list[Child]:
    """``python -m MODULE ARGS`` as ``nproc`` ranks started one by one (see
    :func:`run_two_ranks`), with one thread each (tests.fixtures.preloaded)."""
    env = {
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    return [
        Child(module, args, {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)})
        for rank in range(nproc)
    ]


def finish(ranks: list[Child], timeout: float = 120, stop_on_failure: bool = False) -> list[int]:
    """Each rank's exit code, once every rank has exited by itself; fails the test when a
    rank is still running after ``timeout`` seconds (left waiting for the others) or, with
    ``stop_on_failure``, as soon as one rank fails (its stderr in the message)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(rank.poll() is None for rank in ranks):
        failed = [i for i, rank in enumerate(ranks) if rank.poll() not in (None, 0)]
        if stop_on_failure and failed:
            for rank in ranks:
                rank.kill()
            pytest.fail(
                f"rank {failed[0]} exited with {ranks[failed[0]].poll()}: "
                f"{ranks[failed[0]].stderr()[-3000:]}"
            )
        time.sleep(0.05)
    codes = [rank.poll() for rank in ranks]
    if any(code is None for code in codes):
        for rank in ranks:
            rank.kill()
        tails = "; ".join(f"rank {i}: {rank.stderr()[-1000:]}" for i, rank in enumerate(ranks))
        pytest.fail(
            f"a rank was still running after {timeout} s: "
            f"it was left waiting for the others ({tails})"
        )
    if stop_on_failure:
        assert codes == [0] * len(ranks), [rank.stderr()[-3000:] for rank in ranks]
    return [code for code in codes if code is not None]


def run_ranks(
    module: str, args: list[str], nproc: int = 2, timeout: float = 120
) -> list[tuple[int, str]]:
    """``python -m MODULE ARGS`` as ``nproc`` ranks: each rank's exit code and stderr."""
    ranks = start_ranks(module, args, nproc)
    return [(code, rank.stderr()) for code, rank in zip(finish(ranks, timeout), ranks, strict=True)]


def refused_everywhere(results: list[tuple[int, str]], *expected: str) -> None:
    for rank, (code, err) in enumerate(results):
        lines = [line for line in err.splitlines() if line.startswith("dynamics run: error: ")]
        assert code == 2, (rank, err[-3000:])
        assert len(lines) == 1 and all(text in lines[0] for text in expected), (rank, err[-3000:])


def test_a_refusal_of_rank_0_reaches_every_rank(tmp_path):
    # Only rank 0 checks the output folder, before any setup.
    tokenizer_dir = tmp_path / "tokenizer"
    tiny_tokenizer().save_pretrained(tokenizer_dir)
    out = tmp_path / "run"
    out.mkdir()
    (out / "old.txt").write_text("an earlier run\n")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config(tokenizer_dir, out, batch_size=2)))
    refused_everywhere(run_two_ranks(path), f"output folder {out} is not empty")
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]


def test_a_data_refusal_found_while_rank_0_tokenizes_reaches_every_rank(tmp_path):
    # Rank 0 reads and tokenizes the data first while rank 1 waits for it.
    tokenizer_dir = tmp_path / "tokenizer"
    tiny_tokenizer().save_pretrained(tokenizer_dir)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a row"}\n{"text": \n')
    data = config(tokenizer_dir, tmp_path / "run", batch_size=2)
    data["datasets"][1] = {**data["datasets"][1], "path": str(broken)}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    refused_everywhere(run_two_ranks(path), "dataset 'wikitxt'", "could not be read")
    assert not (tmp_path / "run").exists()
