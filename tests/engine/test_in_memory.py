"""A notebook's run: the model, tokenizer and rows passed to ``dynamics.run`` as Python
objects give the same run as the config that reads them from files."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest
from accelerate.utils import set_seed

import dynamics
from dynamics.data.loading import DataError
from dynamics.engine.model import load_causal_lm, load_tokenizer
from dynamics.engine.preflight import RunSetupError
from dynamics.runs.rundir import read_run
from tests.engine.test_run import tiny_config


def in_memory(data: dict) -> tuple[dict, dict[str, datasets.Dataset]]:
    """The config without its files, and the files' rows as datasets."""
    rows = {}
    for dataset in data["datasets"]:
        rows[dataset["name"]] = datasets.Dataset.from_json(dataset.pop("path"))
    return data, rows


def test_a_run_from_python_objects_equals_the_run_from_files(
    tokenizer_dir, tmp_path, single_thread
):
    # Full fine-tuning: LoRA's initialisation would draw from the RNG after the model's in the
    # file run but not in the notebook's, whose model exists before dynamics.run seeds.
    files = {**tiny_config(tokenizer_dir, tmp_path / "files"), "lora": None}
    dynamics.run(dynamics.RunConfig.from_dict(files), progress=False)

    data, rows = in_memory({**tiny_config(tokenizer_dir, tmp_path / "objects"), "lora": None})
    del data["model"]  # the notebook has its model already
    config = dynamics.RunConfig.from_dict(data)
    model_config = dynamics.RunConfig.from_dict(files).model
    set_seed(config.training.seed)  # the notebook's own seeding before it builds its model
    summary = dynamics.run(
        config,
        progress=False,
        model=load_causal_lm(model_config),
        tokenizer=load_tokenizer(model_config),
        data=rows,
    )

    a, b = read_run(tmp_path / "files"), read_run(tmp_path / "objects")
    for mine, theirs in zip(b.updates, a.updates, strict=True):
        np.testing.assert_allclose(mine.slope_matrix, theirs.slope_matrix, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(mine.weights, theirs.weights, atol=1e-12)
    assert summary["constrained_ppl_reduction"] == pytest.approx(
        a.summary["constrained_ppl_reduction"], rel=1e-9
    )


def test_the_callback_takes_rows_from_python_too(tokenizer_dir, tmp_path):
    data, rows = in_memory(tiny_config(tokenizer_dir, tmp_path / "run"))
    config = dynamics.RunConfig.from_dict(data)
    callback = dynamics.DynamicsCallback(config, load_tokenizer(config.model), data=rows)
    assert callback.data.dataset_names == ["math", "wiki"]
    assert [d.name for d in callback.data.domains] == ["math", "orca", "mmlu"]


def test_missing_unknown_or_doubled_rows_are_refused_by_name(tokenizer_dir, tmp_path):
    data, rows = in_memory(tiny_config(tokenizer_dir, tmp_path / "run"))
    config = dynamics.RunConfig.from_dict(data)
    with pytest.raises(
        DataError, match=r"dataset 'wiki' has no path or hub_id.*data=\{'wiki': rows\}"
    ):
        dynamics.run(config, progress=False, data={k: v for k, v in rows.items() if k != "wiki"})
    with pytest.raises(RunSetupError, match=r"data= names \['wikipedia'\]"):
        dynamics.run(config, progress=False, data={**rows, "wikipedia": rows["wiki"]})
    files = dynamics.RunConfig.from_dict(tiny_config(tokenizer_dir, tmp_path / "run"))
    with pytest.raises(
        RunSetupError, match="dataset 'math' has a path in the config and rows in data="
    ):
        dynamics.run(files, progress=False, data={"math": rows["math"]})
    assert not Path(tmp_path / "run").exists()


def test_a_model_without_its_tokenizer_and_a_config_without_a_model_are_refused(
    tokenizer_dir, tmp_path
):
    data = tiny_config(tokenizer_dir, tmp_path / "run")
    config = dynamics.RunConfig.from_dict(data)
    with pytest.raises(RunSetupError, match="pass model= and tokenizer= together"):
        dynamics.run(config, progress=False, model=load_causal_lm(config.model))
    del data["model"]
    with pytest.raises(
        RunSetupError,
        match=r"names no model.*model\.name_or_path.*model=model, tokenizer=tokenizer",
    ):
        dynamics.run(dynamics.RunConfig.from_dict(data), progress=False)
    assert not Path(tmp_path / "run").exists()
