"""A run of two CPU processes (gloo, one thread each), killed after a resume point and
resumed with two processes, ends with the same files, bit for bit, as the uninterrupted
two-process run; each rank gets its own RNG state back. A resume under another number of
processes is refused on every rank with one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
import yaml

from dynamics.cli import main as cli_main
from dynamics.runs import state as run_state
from tests.engine.test_distributed import config, refused_everywhere, run_ranks
from tests.engine.test_resume import comparable
from tests.fixtures.tiny_tokenizer import tiny_tokenizer

pytestmark = pytest.mark.slow

TIMEOUT = 400  # seconds for one two-process run: a rank left waiting fails the test


def resumable(tokenizer_dir: Path, out: Path) -> dict:
    data = config(tokenizer_dir, out, batch_size=2)
    # Dropout draws from torch's CPU generator in every training step and probe, on every
    # rank: each rank's masks depend on its own RNG state.
    data["lora"]["dropout"] = 0.1
    data["method"]["backtrack"] = 1  # a feasible snapshot in each resume point
    data["training"]["checkpoint_interval"] = 2
    return data


def ranks(*args: str, kill: tuple[str, int] = ("none", 0)) -> list[tuple[int, str]]:
    return run_ranks("tests.engine.ranks_draw", [kill[0], str(kill[1]), *args], timeout=TIMEOUT)


def rank_rng(point: Path, rank: int) -> tuple[torch.Tensor, str]:
    """Rank ``rank``'s saved RNG state: torch's CPU state, and python's and numpy's (JSON)."""
    name = run_state.rank_rng_name("learner", rank)
    tensors = safetensors.torch.load_file(str(point / run_state.RNG_DIR / f"{name}.safetensors"))
    meta = json.loads((point / run_state.RNG_DIR / f"{name}.json").read_text())
    return tensors[meta["torch_cpu"]["__tensor__"]], json.dumps(
        {k: meta[k] for k in ("python", "numpy")}
    )


def test_a_two_process_run_resumed_with_two_processes_gives_the_same_files(tmp_path, capsys):
    tokenizer_dir = tmp_path / "tokenizer"
    tiny_tokenizer().save_pretrained(tokenizer_dir)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(resumable(tokenizer_dir, tmp_path / "reference")))

    for code, err in ranks("run", str(path), "--no-progress"):
        assert code == 0, err[-3000:]
    expected = comparable(tmp_path / "reference")
    assert expected["summary"]["best_checkpoint"] is not None  # a best checkpoint to compare

    # Killed on both ranks as the third stretch of training starts, after the resume point
    # of step 2 (the updates at steps 2 and 4 are still to come).
    out = tmp_path / "killed"
    for code, err in ranks("run", str(path), "--out", str(out), "--no-progress", kill=("train", 3)):
        assert code == -9, err[-3000:]
    assert not (out / "summary.json").exists()
    point = run_state.find_resume_point(out)
    assert point is not None
    assert json.loads((point / run_state.LOOP_FILE).read_text())["processes"] == 2
    # The ranks' generators stand at different states: restoring rank 0's on both would differ.
    (torch0, other0), (torch1, other1) = rank_rng(point, 0), rank_rng(point, 1)
    assert not torch.equal(torch0, torch1) and other0 != other1
    assert (point / run_state.RNG_DIR / f"{run_state.rank_rng_name('feasible', 1)}.json").is_file()

    # One process cannot go on from two processes' resume point: one line, nothing changed.
    before = {
        p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*")) if p.is_file()
    }
    code = cli_main(["run", "--resume", str(out), "--no-progress"])  # in this process: one process
    stderr = capsys.readouterr().err
    lines = [line for line in stderr.splitlines() if line.startswith("dynamics run: error: ")]
    assert code == 2 and len(lines) == 1, stderr[-3000:]
    assert "was saved by 2 processes but this run has 1" in lines[0]
    assert "torchrun --nproc-per-node 2" in lines[0] and f"--resume {out}" in lines[0]
    after = {
        p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*")) if p.is_file()
    }
    assert after == before

    for code, err in ranks("run", "--resume", str(out), "--no-progress"):
        assert code == 0, err[-3000:]
    assert comparable(out) == expected
    assert json.loads((out / "summary.json").read_text())["resumed_at"] == [2]


def test_a_resume_under_another_number_of_processes_is_refused_on_every_rank(tmp_path):
    # A resume point's loop file says how many processes saved it; the check needs no model.
    tokenizer_dir = tmp_path / "tokenizer"
    tiny_tokenizer().save_pretrained(tokenizer_dir)
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text(yaml.safe_dump(config(tokenizer_dir, out, batch_size=2)))

    def write(folder: Path) -> None:
        saved = {"loop": {"step": 4}, "train_seconds": 1.0, "resumed_at": [], "processes": 3}
        (folder / run_state.LOOP_FILE).write_text(json.dumps(saved))

    run_state.write_resume_point(out, 4, write)
    results = run_ranks(
        "dynamics.cli", ["run", "--resume", str(out), "--no-progress"], timeout=TIMEOUT
    )
    refused_everywhere(
        results, "was saved by 3 processes but this run has 2", "torchrun --nproc-per-node 3"
    )
