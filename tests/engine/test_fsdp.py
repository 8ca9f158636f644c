"""The learner on a model sharded with FSDP2 (two CPU processes, gloo, one thread each):
a probe's rollback is exact, and training and evaluation follow one unsharded process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.engine.test_distributed import config
from tests.fixtures.tiny_tokenizer import tiny_tokenizer

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("fsdp_script.py")


def launch(tmp_path: Path, name: str, nproc: int, batch_size: int, tokenizer_dir: Path) -> list[dict]:
    data = config(tokenizer_dir, tmp_path / name / "run", batch_size)
    data["lora"] = None  # full fine-tuning: every weight is sharded
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / name
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(SCRIPT), str(path), str(out)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(nproc)]


def test_probing_is_exact_on_a_sharded_model(tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"
    tiny_tokenizer().save_pretrained(tokenizer_dir)
    [single] = launch(tmp_path, "single", nproc=1, batch_size=4, tokenizer_dir=tokenizer_dir)
    sharded = launch(tmp_path, "sharded", nproc=2, batch_size=2, tokenizer_dir=tokenizer_dir)
    assert single["sharded_parameters"] == 0
    for rank in sharded:
        assert rank["sharded_parameters"] == 21  # every weight of the tiny Llama is a shard
        # The probe moved the model; the rollback undid it exactly, optimizer state included.
        assert rank["probed"] != rank["before"]
        assert rank["restored"] == rank["before"]
        assert rank["retrained"] == rank["trained"]
        for name in ("start", "before", "probed", "trained"):
            np.testing.assert_allclose(rank[name], single[name], rtol=1e-5)
