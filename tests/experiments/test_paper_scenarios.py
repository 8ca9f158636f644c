"""The paper's 54 scenarios as runs: every one builds and validates from the hub registry and
from the offline fixtures; a sample trains a few steps on a tiny model (all of them: slow)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json
import logging
from pathlib import Path

import pytest
import yaml

from dynamics.cli import main as cli_main
from dynamics.data.paper_datasets import PAPER_DATASETS
from dynamics.data.scenarios import SCENARIOS, load_scenario
from dynamics.engine.config import RunConfig
from dynamics.experiments.paper_scenarios import scenario_config
from tests.fixtures.tiny_tokenizer import FIXTURES

PAPER_FIXTURES = FIXTURES / "paper_datasets"
NAMES = list(SCENARIOS)
TINY_LLAMA = (
    "{model_type: llama, vocab_size: 512, hidden_size: 16, intermediate_size: 32, "
    "num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, "
    "max_position_embeddings: 128}"
)


def tiny_overrides(tokenizer_dir: Path, out: Path, method: str = "dynamics") -> list[str]:
    """One training step per probe and per run, one evaluation batch: the cheapest real run."""
    overrides = [
        "model.name_or_path=null",
        f"model.init_config={TINY_LLAMA}",
        f"model.tokenizer={tokenizer_dir}",
        "lora.rank=2",
        "lora.target_modules=[q_proj]",
        "training.total_steps=2",
        "training.batch_size=1",
        "training.sequence_length=96",
        "evaluation.interval=2",
        "evaluation.batches=1",
        "evaluation.reduced_batches=1",
        "evaluation.selection_margin=0",  # one batch has no standard error
        f"method.name={method}",
        f"output_dir={out}",
    ]
    if method == "dynamics":
        overrides += [
            "method.schedule=[0]",
            "method.probe_cap=1",
            "method.grid.lambdas=[1.0]",
            "method.grid.epsilons=[0.0]",
        ]
    return overrides


@pytest.mark.parametrize("name", NAMES)
def test_every_scenario_builds_from_the_hub_and_from_local_files(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = load_scenario(name)
    # What `dynamics scenarios config` prints is the validated config itself.
    assert cli_main(["scenarios", "config", name]) == 0
    hub = RunConfig.model_validate(yaml.safe_load(capsys.readouterr().out))
    assert hub == scenario_config(name)
    local = scenario_config(name, data_root=PAPER_FIXTURES)
    expected = [
        *((t.abbrev, "target") for t in scenario.targets),
        *((t.abbrev, "non-target") for t in scenario.non_targets),
        *((c.abbrev, "constraint") for c in scenario.constraints),
    ]
    for config in (hub, local):
        assert [(d.name, d.role) for d in config.datasets] == expected
        assert {d.name: d.metric for d in config.datasets if d.role == "constraint"} == {
            c.abbrev: c.metric for c in scenario.constraints
        }
    assert all(d.hub_id == PAPER_DATASETS[d.name].hub_id and d.path is None for d in hub.datasets)
    assert all(d.path == str(PAPER_FIXTURES / f"{d.name}.jsonl") for d in local.datasets)
    # The paper's budgets, except where the registry's split holds fewer training rows
    # (GSM8K's 7,473 against GS(10k), BillSum's 18,949 against BS(20k)): every row.
    beyond_the_split = {("GS", 10_000), ("BS", 20_000)}
    expected_budgets = [
        (d.abbrev, None if (d.abbrev, d.budget) in beyond_the_split else d.budget)
        for d in scenario.fine_tuning_datasets
    ]
    assert [(d.name, d.budget) for d in hub.datasets if d.role != "constraint"] == expected_budgets
    # The fixtures hold a few rows each: every one of them is used.
    assert [(d.name, d.budget) for d in local.datasets if d.role != "constraint"] == [
        (d.abbrev, None) for d in scenario.fine_tuning_datasets
    ]


def test_the_papers_settings_and_learning_rate_by_model(caplog: pytest.LogCaptureFixture) -> None:
    config = scenario_config("paper/s28")
    assert (
        config.training.total_steps,
        config.training.batch_size,
        config.training.sequence_length,
    ) == (2048, 8, 512)
    assert (
        config.evaluation.interval,
        config.evaluation.batches,
        config.evaluation.reduced_batches,
    ) == (64, 200, 50)
    assert (config.model.name_or_path, config.lora and config.lora.rank, config.optimizer.lr) == (
        "Qwen/Qwen2.5-3B",
        32,
        1e-4,
    )
    assert (config.optimizer.warmup_steps, config.method.name, config.method.schedule) == (
        0,
        "dynamics",
        "dense-warmup",
    )
    assert config.output_dir == "runs/paper-s28"
    assert scenario_config("paper/s28", ["model.name_or_path=Qwen/Qwen3-8B"]).optimizer.lr == 5e-5
    assert (
        scenario_config("paper/s28", ["model.name_or_path=google/gemma-3-12b-pt"]).optimizer.lr
        == 5e-5
    )
    assert (
        scenario_config(
            "paper/s28", ["model.name_or_path=Qwen/Qwen3-8B", "optimizer.lr=3e-4"]
        ).optimizer.lr
        == 3e-4
    )
    with caplog.at_level(logging.WARNING):
        assert scenario_config("paper/s28", ["model.name_or_path=my/model"]).optimizer.lr == 1e-4
    assert "my/model is not one of the paper's models" in caplog.text


def test_any_method_schedule_or_predictor_can_be_chosen() -> None:
    fixed = scenario_config("paper/s28", ["method.name=fixed"])
    assert fixed.method.weights == {d.name: 1.0 for d in fixed.training_datasets}
    chosen = scenario_config(
        "paper/s28",
        ["method.schedule=no-warmup", "method.predictor=curve", "datasets.NM.budget=100"],
    )
    assert (chosen.method.schedule, chosen.method.predictor) == ("no-warmup", "curve")
    assert next(d for d in chosen.datasets if d.name == "NM").budget == 100
    with pytest.raises(
        ValueError, match=r"paper/s51: .*gradient-alignment cannot keep accuracy constraints"
    ):
        scenario_config("paper/s51", ["method.name=gradient-alignment"])


def test_scenarios_config_prints_the_resolved_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["scenarios", "config", "paper/s51", "training.total_steps=256"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert RunConfig.model_validate(printed) == scenario_config(
        "paper/s51", ["training.total_steps=256"]
    )
    assert [d["hub_id"] for d in printed["datasets"]] == [
        PAPER_DATASETS[d["name"]].hub_id for d in printed["datasets"]
    ]
    assert cli_main(["scenarios", "config", "paper/s51", "--data-root", str(PAPER_FIXTURES)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert all(Path(d["path"]).parent == PAPER_FIXTURES for d in printed["datasets"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["scenarios", "config", "paper/s99"], "unknown scenario 'paper/s99'"),
        (
            ["scenarios", "config", "paper/s1", "--data-root", "/nonexistent"],
            "no file for dataset MM",
        ),
        (["scenarios", "config", "paper/s1", "training.total_steps=0"], "training.total_steps"),
        (["run", "--scenario", "paper/s1", "cfg.yaml"], "either a run config or --scenario"),
        (["run", "cfg.yaml", "--data-root", "x"], "--data-root points a --scenario's datasets"),
    ],
)
def test_bad_scenario_requests_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def run_scenario(name: str, tokenizer_dir: Path, out: Path, method: str) -> dict:
    argv = ["run", "--scenario", name, "--data-root", str(PAPER_FIXTURES), "--no-progress"]
    assert cli_main(argv + tiny_overrides(tokenizer_dir, out, method)) == 0
    summary = json.loads((out / "summary.json").read_text())
    scenario = load_scenario(name)
    assert summary["domain_names"] == list(scenario.evaluation_domains)
    assert summary["dataset_names"] == [d.abbrev for d in scenario.fine_tuning_datasets]
    assert summary["domain_metrics"] == [
        *(["loss"] * scenario.n_T),
        *(c.metric for c in scenario.constraints),
    ]
    return summary


@pytest.mark.parametrize(
    ("name", "method"),
    [("paper/s1", "dynamics"), ("paper/s54", "dynamics"), ("paper/s28", "fixed")],
    ids=["s1-loss-benchmarks", "s54-accuracy-and-loss", "s28-fixed"],
)
def test_a_sample_of_scenarios_trains(
    name: str, method: str, tokenizer_dir: Path, tmp_path: Path
) -> None:
    summary = run_scenario(name, tokenizer_dir, tmp_path / "run", method)
    # One mixture decision at step 0 (the schedule [0]; fixed weights are recorded once too).
    assert (summary["method"], summary["num_updates"], summary["total_steps"]) == (method, 1, 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_scenario_trains(name: str, tokenizer_dir: Path, tmp_path: Path) -> None:
    summary = run_scenario(name, tokenizer_dir, tmp_path / "run", "dynamics")
    assert summary["num_updates"] == 1 and summary["total_steps"] == 2
