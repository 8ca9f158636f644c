"""Same config and seed, same records; a new seed keeps the evaluation and test rows."""

from __future__ import annotations

import json

import torch

from dynamics.engine.components import build_run
from dynamics.engine.config import RunConfig
from dynamics.engine.run import run
from tests.engine.test_run import tiny_config


def untimed_rows(path):
    return [
        {k: v for k, v in json.loads(line).items() if not k.endswith("_seconds")}
        for line in path.read_text().splitlines()
    ]


def test_the_same_config_and_seed_give_identical_records(tokenizer_dir, tmp_path):
    for name in ("a", "b"):
        run(
            RunConfig.from_dict(tiny_config(tokenizer_dir, tmp_path / name, variant="robust")),
            progress=False,
        )
    for log in ("metrics.jsonl", "controller.jsonl"):
        assert untimed_rows(tmp_path / "a" / log) == untimed_rows(tmp_path / "b" / log)


def evaluation_rows(tokenizer_dir, tmp_path, **training):
    data = tiny_config(tokenizer_dir, tmp_path / "unused")
    data["training"].update(training)
    built = build_run(RunConfig.from_dict(data))
    return {
        domain.name: [
            batch["input_ids"].tolist() for batch in [*domain.eval_batches, *domain.test_batches]
        ]
        for domain in built.learner.domains
    }, [p.detach().clone() for p in built.learner.trainable_parameters]


def test_only_data_seed_draws_the_evaluation_and_test_rows(tokenizer_dir, tmp_path):
    rows, adapter = evaluation_rows(tokenizer_dir, tmp_path, seed=0)
    rows_new_seed, adapter_new_seed = evaluation_rows(tokenizer_dir, tmp_path, seed=1)
    rows_new_data_seed, _ = evaluation_rows(tokenizer_dir, tmp_path, seed=0, data_seed=1)
    # A new run seed initialises differently but is scored on exactly the same rows...
    assert not all(torch.equal(a, b) for a, b in zip(adapter, adapter_new_seed, strict=True))
    assert rows_new_seed == rows
    # ...while a new data seed draws other splits.
    assert rows_new_data_seed != rows
