"""Every bad input is refused cleanly: one line naming the field and the fix, exit code 2
from ``dynamics run``, and no run folder left behind (docs/errors.md lists them all).

Each case mutates the tiny config of ``test_run.py`` in one way and runs the real CLI
entry. Config mistakes fail in validation, environment mistakes in ``preflight`` (before
the model is loaded), data mistakes while the rows are read (before training).
"""

from __future__ import annotations

import os

# Before datasets / huggingface_hub read them: nothing here may touch the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import copy
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamics.cli import main as cli_main
from dynamics.engine import preflight as preflight_module
from dynamics.engine.config import ConfigError, RunConfig
from dynamics.engine.preflight import RunSetupError, precision_warnings, preflight
from tests.engine.test_run import tiny_config
from tests.fixtures.tiny_tokenizer import FIXTURES

Mutation = Callable[[dict[str, Any], Path], None]


@dataclass(frozen=True)
class Case:
    id: str
    mutate: Mutation
    expect: tuple[str, ...]
    """Substrings of the one-line message: the field (or dataset) and the fix."""
    env: dict[str, str] = field(default_factory=dict)


def dataset(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(d for d in data["datasets"] if d["name"] == name)


def setting(path: str, value: Any) -> Mutation:
    """Set ``a.b.c`` (creating sections) to ``value``."""

    def mutate(data: dict[str, Any], tmp: Path) -> None:
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    return mutate


def dataset_setting(name: str, **values: Any) -> Mutation:
    def mutate(data: dict[str, Any], tmp: Path) -> None:
        dataset(data, name).update(values)

    return mutate


def dataset_file(name: str, text: str, suffix: str = ".jsonl") -> Mutation:
    """Point dataset ``name`` at a new file holding ``text``."""

    def mutate(data: dict[str, Any], tmp: Path) -> None:
        path = tmp / f"{name}-data{suffix}"
        path.write_text(text)
        dataset(data, name)["path"] = str(path)

    return mutate


def add_dataset(entry: dict[str, Any]) -> Mutation:
    def mutate(data: dict[str, Any], tmp: Path) -> None:
        data["datasets"].append(dict(entry))

    return mutate


def without_accuracy_constraint(data: dict[str, Any]) -> None:
    data["datasets"] = [d for d in data["datasets"] if d["name"] != "mmlu"]


def gradient_alignment(alignment_batches: int, keep_accuracy: bool) -> Mutation:
    def mutate(data: dict[str, Any], tmp: Path) -> None:
        data["method"] = {
            "name": "gradient-alignment",
            "schedule": [0, 4],
            "alignment_batches": alignment_batches,
        }
        if not keep_accuracy:
            without_accuracy_constraint(data)

    return mutate


def output_under_a_file(data: dict[str, Any], tmp: Path) -> None:
    (tmp / "a-file").write_text("not a folder\n")
    data["output_dir"] = str(tmp / "a-file" / "run")


def output_not_empty(data: dict[str, Any], tmp: Path) -> None:
    out = Path(data["output_dir"])
    out.mkdir()
    (out / "metrics.jsonl").write_text("precious\n")


def output_not_writable(data: dict[str, Any], tmp: Path) -> None:
    parent = tmp / "read-only"
    parent.mkdir()
    parent.chmod(0o555)
    data["output_dir"] = str(parent / "run")


def model_path(name: str) -> Mutation:
    def mutate(data: dict[str, Any], tmp: Path) -> None:
        tokenizer = data["model"]["tokenizer"]
        data["model"] = {"name_or_path": name.replace("TMP", str(tmp)), "tokenizer": tokenizer}

    return mutate


def init_config(**values: Any) -> Mutation:
    def mutate(data: dict[str, Any], tmp: Path) -> None:
        data["model"]["init_config"] = {**data["model"]["init_config"], **values}

    return mutate


def blank_constraint_rows(data: dict[str, Any], tmp: Path) -> None:
    """A constraint whose every row is blank text: no evaluation example is left."""
    path = tmp / "blank.jsonl"
    path.write_text('{"text": " "}\n' * 4)
    dataset(data, "orca").update(path=str(path), format="text", columns={})


def all_roles_non_target(data: dict[str, Any], tmp: Path) -> None:
    for entry in data["datasets"]:
        if entry["role"] == "target":
            entry["role"] = "non-target"
            for key in ("eval_size", "test_size"):
                entry.pop(key, None)


MATH = {
    "path": str(FIXTURES / "metamath.jsonl"),
    "format": "instruction",
    "columns": {"prompt": "query"},
}


def fixed_token_shares_below_the_floor(data: dict[str, Any], tmp: Path) -> None:
    """1% of the tokens on math, whose batch share (known once its rows are read) is under
    the floor."""
    data["method"] = {"name": "fixed", "weights": {"math": 1, "wiki": 99}, "min_weight": 0.2}
    data["training"]["sampling"] = "tokens"


CASES = [
    # --- the config (RunConfig validation) -----------------------------------------------
    Case("no-targets", all_roles_non_target, ("datasets", "role 'target'")),
    Case(
        "dataset-name-twice",
        add_dataset(
            {"name": "wiki", "path": str(FIXTURES / "wikipedia.txt"), "role": "non-target"}
        ),
        ("datasets", "'wiki'", "unique"),
    ),
    Case(
        "dataset-file-twice",
        add_dataset(
            {"name": "wiki2", "path": str(FIXTURES / "wikipedia.jsonl"), "role": "non-target"}
        ),
        ("datasets", "'wiki'", "'wiki2'", "same data"),
    ),
    Case(
        "target-and-constraint-same-file",
        add_dataset({"name": "math_check", "role": "constraint", **MATH}),
        ("'math'", "'math_check'", "target", "constraint"),
    ),
    Case(
        "target-and-constraint-same-name",
        add_dataset(
            {"name": "math", "path": str(FIXTURES / "openorca.jsonl"), "role": "constraint"}
        ),
        ("'math'", "target", "constraint", "rename"),
    ),
    Case(
        "grid-lambda-negative",
        setting("method.grid.lambdas", [-1.0, 10.0]),
        ("method.grid.lambdas", "> 0"),
    ),
    Case(
        "grid-epsilon-nan",
        setting("method.grid.epsilons", [math.nan]),
        ("method.grid.epsilons", "finite"),
    ),
    Case(
        "grid-empty", setting("method.grid.lambdas", []), ("method.grid.lambdas", "empty", "remove")
    ),
    Case(
        "fixed-weight-negative",
        setting("method", {"name": "fixed", "weights": {"math": -1.0, "wiki": 1.0}}),
        ("method.weights", ">= 0"),
    ),
    Case(
        "fixed-weight-nan",
        setting("method", {"name": "fixed", "weights": {"math": math.nan, "wiki": 1.0}}),
        ("method.weights.math", "finite"),
    ),
    Case(
        "fixed-weight-infinite",
        setting("method", {"name": "fixed", "weights": {"math": math.inf, "wiki": 1.0}}),
        ("method.weights.math", "finite"),
    ),
    Case(
        "fixed-weights-all-zero",
        setting("method", {"name": "fixed", "weights": {"math": 0.0, "wiki": 0.0}}),
        ("method.weights", "positive sum"),
    ),
    Case(
        "schedule-past-the-end",
        setting("method.schedule", [0, 4, 8]),
        ("method.schedule", "before the end of training (8 steps)"),
    ),
    Case(
        "schedule-unsorted",
        setting("method.schedule", [0, 4, 2]),
        ("method.schedule", "strictly increasing"),
    ),
    Case(
        "schedule-duplicated",
        setting("method.schedule", [0, 2, 2]),
        ("method.schedule", "strictly increasing"),
    ),
    Case(
        "schedule-empty",
        setting("method.schedule", []),
        ("method.schedule", "empty list", "dense-warmup"),
    ),
    Case(
        "schedule-unknown-name",
        setting("method.schedule", "dense"),
        ("method.schedule", "unknown schedule", "dense-warmup"),
    ),
    Case(
        "probe-cap-zero",
        setting("method.probe_cap", 0),
        ("method.probe_cap", "greater than or equal to 1"),
    ),
    Case(
        "probe-min-above-cap",
        setting("method.probe_min", 10_000),
        ("method.probe_min", "from 1 to probe_cap"),
    ),
    Case(
        "gain-exponent-zero",
        setting("method.gain_exponent", 0.0),
        ("method.gain_exponent", "greater than 0"),
    ),
    Case(
        "gain-exponent-above-one",
        setting("method.gain_exponent", 1.5),
        ("method.gain_exponent", "less than or equal to 1"),
    ),
    Case(
        "target-noise-negative",
        setting("method.target_noise", -1.0),
        ("method.target_noise", "greater than or equal to 0"),
    ),
    Case(
        "answer-tolerance-one",
        setting("method.answer_tolerance", 1.0),
        ("method.answer_tolerance", "less than 1"),
    ),
    Case(
        "option-not-in-the-library",
        setting("method.noise_margin", 1.0),
        ("method.noise_margin", "unknown field", "docs/config.md"),
    ),
    Case(
        "accuracy-on-text-format",
        dataset_setting("mmlu", format="text"),
        ("datasets.3", "'mmlu'", "metric 'accuracy' needs format 'multiple_choice'"),
    ),
    Case(
        "gradient-alignment-with-accuracy",
        gradient_alignment(2, keep_accuracy=True),
        ("gradient-alignment", "'mmlu'", "accuracy", "method.name: dynamics"),
    ),
    Case(
        "alignment-batches-over-evaluation",
        gradient_alignment(5, keep_accuracy=False),
        ("method.alignment_batches (5)", "evaluation.batches (3)"),
    ),
    Case(
        "string-for-int",
        setting("training.total_steps", "many"),
        ("training.total_steps", "valid integer"),
    ),
    Case("list-for-dict", setting("training", [8, 2]), ("training", "valid dictionary")),
    Case(
        "dict-for-list",
        lambda data, tmp: data.update(datasets={d["name"]: d for d in data["datasets"]}),
        ("datasets", "valid list"),
    ),
    Case(
        "unknown-field",
        setting("training.totl_steps", 8),
        ("training.totl_steps", "unknown field", "docs/config.md"),
    ),
    Case(
        "missing-model",
        lambda data, tmp: data.pop("model"),
        ("names no model", "model.name_or_path", "model.init_config"),
    ),
    Case(
        "dataset-without-rows",
        lambda data, tmp: data["datasets"][1].pop("path"),
        ("dataset 'wiki' has no path or hub_id",),
    ),
    Case(
        "unknown-tracker",
        setting("trackers", ["comet"]),
        ("trackers.0", "'tensorboard', 'wandb' or 'mlflow'"),
    ),
    Case(
        "unknown-attention",
        setting("model.attn_implementation", "flash"),
        ("model.attn_implementation", "'sdpa'"),
    ),
    Case(
        "flash-attention-on-cpu",
        setting("model.attn_implementation", "flash_attention_2"),
        ("model.attn_implementation flash_attention_2", "CUDA GPU", "sdpa"),
    ),
    Case(
        "unknown-packing",
        setting("training.packing", "documents"),
        ("training.packing", "'per-document'"),
    ),
    Case(
        "quantization-of-init-config",
        setting("model.quantization", {"bits": 4}),
        ("model.quantization", "model.init_config", "remove model.quantization"),
    ),
    Case(
        "quantization-bits-unknown",
        setting("model.quantization", {"bits": 3}),
        ("model.quantization.bits", "4 or 8"),
    ),
    Case(
        "adam-beta-out-of-range",
        setting("optimizer.betas", [0.9, 1.5]),
        ("optimizer.betas", "[0, 1)"),
    ),
    Case("learning-rate-infinite", setting("optimizer.lr", math.inf), ("optimizer.lr", "finite")),
    Case(
        "eval-size-zero-for-a-target",
        dataset_setting("math", eval_size=0),
        ("datasets.0", "'math'", "eval_size", "evaluated"),
    ),
    Case(
        "held-out-fractions-over-one",
        dataset_setting("wiki", eval_size=0.6, test_size=0.6),
        ("datasets.1", "'wiki'", "eval_size + test_size"),
    ),
    Case(
        "negative-eval-size",
        dataset_setting("orca", eval_size=-2),
        ("datasets.2", "'orca'", "eval_size=-2", ">= 0"),
    ),
    Case(
        "unknown-columns-key",
        dataset_setting("math", columns={"promt": "query"}),
        ("datasets.0", "'math'", "unknown columns keys ['promt']"),
    ),
    Case(
        "backtrack-with-fixed-weights",
        setting("method", {"name": "fixed", "weights": {"math": 1, "wiki": 1}, "backtrack": 1}),
        ("method.backtrack", "method.name: dynamics"),
    ),
    Case(
        "checkpoint-interval-negative",
        setting("training.checkpoint_interval", -1),
        ("training.checkpoint_interval", "greater than or equal to 0"),
    ),
    Case(
        "data-seed-negative",
        setting("training.data_seed", -3),
        ("training.data_seed", "greater than or equal to 0"),
    ),
    # --- the environment (preflight, before the model is loaded) -------------------------
    Case(
        "unknown-model-path",
        model_path("TMP/no-such-model"),
        ("model.name_or_path", "no-such-model", "no such local folder"),
    ),
    Case(
        "unknown-model-hub-id",
        model_path("no-such-org/no-such-model"),
        ("model.name_or_path", "no-such-org/no-such-model", "offline"),
    ),
    Case("unknown-model-type", init_config(model_type="llamma"), ("model.init_config", "'llamma'")),
    Case(
        "unknown-tokenizer-path",
        setting("model.tokenizer", "/no/such/tokenizer"),
        ("model.tokenizer", "/no/such/tokenizer", "no such local folder"),
    ),
    Case(
        "vocab-smaller-than-tokenizer",
        init_config(vocab_size=100),
        ("vocab_size", "100", "tokenizer"),
    ),
    Case(
        "sequence-longer-than-positions",
        setting("training.sequence_length", 512),
        ("training.sequence_length", "512", "max_position_embeddings", "256"),
    ),
    Case(
        "lora-target-module-missing",
        setting("lora.target_modules", ["q_projj"]),
        ("lora.target_modules", "'q_projj'", "q_proj"),
    ),
    Case(
        "full-fine-tuning-fp16-weights-fp16",
        lambda data, tmp: data.update(
            lora=None,
            model={**data["model"], "dtype": "float16"},
            training={**data["training"], "mixed_precision": "fp16"},
        ),
        ("training.mixed_precision", "fp16", "model.dtype", "float32"),
    ),
    Case(
        "launched-under-fsdp1",
        lambda data, tmp: None,
        (
            "FSDP version 1",
            "FSDP_VERSION unset, meaning 1",
            "fsdp_version: 2",
            "plain data parallelism",
        ),
        env={"ACCELERATE_USE_FSDP": "true"},
    ),
    Case(
        "launched-under-deepspeed",
        lambda data, tmp: None,
        ("DeepSpeed", "only under FSDP2", "fsdp_version: 2"),
        env={"ACCELERATE_USE_DEEPSPEED": "true"},
    ),
    Case(
        "unknown-dataset-path",
        dataset_setting("wiki", path="/no/such/wiki.jsonl"),
        ("dataset 'wiki'", "/no/such/wiki.jsonl", "does not exist"),
    ),
    Case("output-folder-not-empty", output_not_empty, ("output folder", "not empty", "--out")),
    Case(
        "output-folder-under-a-file", output_under_a_file, ("output_dir", "a-file", "not a folder")
    ),
    Case(
        "output-folder-not-writable",
        output_not_writable,
        ("output_dir", "read-only", "not writable"),
    ),
    # --- the data (read before training) -------------------------------------------------
    Case(
        "unknown-hub-dataset",
        lambda data, tmp: dataset(data, "wiki").update(
            path=None, hub_id="no-such-org/no-such-dataset"
        ),
        ("dataset 'wiki'", "no-such-org/no-such-dataset", "could not be found", "offline"),
    ),
    Case(
        "unknown-split",
        dataset_setting("wiki", split="validation"),
        ("dataset 'wiki'", "split", "validation"),
    ),
    Case(
        "unknown-file-extension",
        dataset_file("wiki", "a,b\n", suffix=".csv"),
        ("dataset 'wiki'", "unknown extension '.csv'"),
    ),
    Case("empty-dataset-file", dataset_file("wiki", ""), ("dataset 'wiki'", "empty")),
    Case("blank-dataset-file", dataset_file("wiki", "\n\n"), ("dataset 'wiki'", "empty")),
    Case(
        "malformed-jsonl",
        dataset_file("wiki", '{"text": "a"}\n{"text": \n'),
        ("dataset 'wiki'", "could not be read", "JSON"),
    ),
    Case(
        "missing-column",
        dataset_setting("math", columns={"prompt": "qury"}),
        ("dataset 'math'", "'qury'", "columns"),
    ),
    Case(
        "column-of-the-wrong-type",
        dataset_file("wiki", '{"text": 3}\n' * 12),
        ("dataset 'wiki'", "row 0", "'text'", "string"),
    ),
    Case(
        "accuracy-on-non-multiple-choice-rows",
        dataset_setting("mmlu", path=str(FIXTURES / "wikipedia.txt")),
        ("dataset 'mmlu'", "'question'", "columns"),
    ),
    Case(
        "multiple-choice-answer-not-a-choice",
        dataset_setting("mmlu", columns={"answer": "subject"}),
        ("dataset 'mmlu'", "in 'subject'", "neither a 0-based index"),
    ),
    Case(
        "fields-template-unknown-column",
        dataset_setting("math", fields={"prompt": "{problem}"}),
        ("dataset 'math'", "fields.prompt", "row 0 does not have"),
    ),
    Case(
        "too-few-rows-for-eval-and-test",
        dataset_setting("math", eval_size=10, test_size=10),
        ("dataset 'math'", "eval_size=10", "16", "lower them"),
    ),
    Case(
        "no-training-rows-left",
        dataset_setting("wiki", eval_size=6, test_size=6),
        ("dataset 'wiki'", "no training rows", "eval_size"),
    ),
    Case(
        "budget-over-the-rows",
        dataset_setting("math", budget=100),
        ("dataset 'math'", "budget=100", "lower budget"),
    ),
    Case(
        "prompt-longer-than-sequence",
        setting("training.sequence_length", 8),
        ("dataset 'math'", "sequence_length=8", "training.sequence_length"),
    ),
    Case(
        "no-evaluation-examples", blank_constraint_rows, ("dataset 'orca'", "eval", "no examples")
    ),
    Case(
        "fixed-token-shares-below-the-floor",
        fixed_token_shares_below_the_floor,
        (
            "method.weights draw {'math': 0.0111}",
            "training.sampling: tokens",
            "method.min_weight (0.2)",
        ),
    ),
]


def snapshot(path: Path) -> dict[str, bytes] | None:
    """Every file under ``path`` with its bytes, or None when it does not exist."""
    if not path.exists():
        return None
    if path.is_file():
        return {"": path.read_bytes()}
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def test_case_ids_are_unique():
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 25


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_refused_in_one_line(case: Case, tokenizer_dir, tmp_path, capsys, monkeypatch):
    data = tiny_config(tokenizer_dir, tmp_path / "run")
    case.mutate(data, tmp_path)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    if case.id == "output-folder-not-writable":
        # root writes anywhere whatever the mode bits, so the operating system's refusal
        # is simulated at the one place preflight asks it.
        monkeypatch.setattr(
            preflight_module,
            "_creatable_in",
            lambda folder: PermissionError(13, "Permission denied"),
        )
    out = Path(data["output_dir"]) if isinstance(data.get("output_dir"), str) else tmp_path / "run"
    before = snapshot(out)
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(data))
    capsys.readouterr()

    code = cli_main(["run", str(config_path), "--no-progress"])

    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.out == ""
    lines = captured.err.rstrip("\n").split("\n")
    assert len(lines) == 1, captured.err
    message = lines[0]
    assert message.startswith("dynamics run: error: "), message
    for text in case.expect:
        assert text in message, f"{text!r} not in {message!r}"
    assert snapshot(out) == before
    if case.id == "output-folder-under-a-file":
        assert (tmp_path / "a-file").read_text() == "not a folder\n"


def test_malformed_yaml_is_one_line_with_its_position(tmp_path, capsys):
    config_path = tmp_path / "run.yaml"
    config_path.write_text(
        "model:\n  init_config: {model_type: llama\ntraining:\n  total_steps: 8\n"
    )
    assert cli_main(["run", str(config_path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid YAML" in err and "line " in err
    assert not (tmp_path / "run").exists()


def test_missing_config_file_is_one_line(tmp_path, capsys):
    assert cli_main(["run", str(tmp_path / "nothere.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothere.yaml does not exist" in err


def test_override_without_a_value_is_one_line(tokenizer_dir, tmp_path, capsys):
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(tiny_config(tokenizer_dir, tmp_path / "run")))
    assert cli_main(["run", str(config_path), "training.total_steps"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "key.path=value" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["scenarios", "show", "paper/s99"], "unknown scenario 'paper/s99'"),
        (["scenarios", "show", "s28"], "paper/s28"),
        (["cost", "--scenario", "no-such-scenario"], "dynamics scenarios list"),
        (["run", "--scenario", "paper/s99"], "unknown scenario 'paper/s99'"),
        (
            ["scenarios", "config", "paper/s1", "--data-root", "/nonexistent"],
            "add /nonexistent/MM.jsonl",
        ),
        (
            ["scenarios", "config", "paper/s51", "method.name=gradient-alignment"],
            "cannot keep accuracy constraints",
        ),
    ],
    ids=[
        "scenario-number-out-of-range",
        "scenario-without-prefix",
        "cost-unknown-scenario",
        "run-unknown-scenario",
        "data-root-without-the-file",
        "scenario-override-invalid",
    ],
)
def test_unknown_scenario_is_one_line(argv, expect, capsys):
    # The run config has no scenario field: scenarios are named on these commands only.
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"dynamics {argv[0]}: error: ") and expect in captured.err


# --- warnings and the environment checks, without a GPU ------------------------------------


def _config(tokenizer_dir: Path, tmp_path: Path, **changes: Any) -> RunConfig:
    data = tiny_config(tokenizer_dir, tmp_path / "run")
    for path, value in changes.items():
        setting(path.replace("__", "."), value)(data, tmp_path)
    return RunConfig.from_dict(data)


def test_full_fine_tuning_in_bf16_warns_that_weights_stay_in_their_loaded_dtype(
    tokenizer_dir, tmp_path
):
    import torch

    full_bf16 = _config(tokenizer_dir, tmp_path, lora=None, training__mixed_precision="bf16")
    # model.dtype 'auto' loads bfloat16 on a GPU with bf16 support: no fp32 master weights.
    [warning] = precision_warnings(full_bf16, loaded_dtype=torch.bfloat16)
    assert "training.mixed_precision bf16" in warning and "lora: null" in warning
    assert "bfloat16" in warning and "model.dtype: float32" in warning
    # Loaded in float32 (explicitly, or 'auto' on a CPU) the master weights are fp32.
    assert precision_warnings(full_bf16, loaded_dtype=torch.float32) == []
    explicit = _config(
        tokenizer_dir,
        tmp_path,
        lora=None,
        training__mixed_precision="bf16",
        model__dtype="bfloat16",
    )
    assert len(precision_warnings(explicit)) == 1
    fp32 = _config(
        tokenizer_dir, tmp_path, lora=None, training__mixed_precision="bf16", model__dtype="float32"
    )
    assert precision_warnings(fp32) == []
    # A LoRA adapter is created in float32 whatever the base weights' dtype.
    lora_bf16 = _config(
        tokenizer_dir, tmp_path, training__mixed_precision="bf16", model__dtype="bfloat16"
    )
    assert precision_warnings(lora_bf16) == []


def test_preflight_returns_and_logs_the_warning_and_creates_nothing(
    tokenizer_dir, tmp_path, caplog
):
    config = _config(
        tokenizer_dir,
        tmp_path,
        lora=None,
        training__mixed_precision="bf16",
        model__dtype="bfloat16",
    )
    with caplog.at_level(logging.WARNING, logger="dynamics.engine.preflight"):
        warnings = preflight(config)
    assert len(warnings) == 1 and warnings[0] in caplog.text
    assert not (tmp_path / "run").exists()
    assert preflight(_config(tokenizer_dir, tmp_path)) == []


@pytest.mark.parametrize("value", ["false", "0", ""])
def test_accelerate_flags_that_are_off_do_not_refuse(value, tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", value)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", value)
    assert preflight(_config(tokenizer_dir, tmp_path)) == []


def test_an_fsdp2_launch_is_accepted(tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert preflight(_config(tokenizer_dir, tmp_path)) == []
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(RunSetupError, match="FSDP version 1"):
        preflight(_config(tokenizer_dir, tmp_path))


# --- config validation under random mutations ----------------------------------------------

BASE = tiny_config(Path("tokenizer"), Path("runs/out"))
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(-5, 40), max_size=4),
    st.lists(st.floats(allow_nan=True), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(-3, 3), max_size=2),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into the nested config (sections, list items and leaves)."""
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


PATHS = _paths(BASE)


def _mutate(data: dict[str, Any], path: tuple[Any, ...], action: str, value: Any) -> None:
    parent: Any = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "extra" and isinstance(parent, dict):
        parent[f"{last}_typo"] = value
    else:
        parent[last] = value


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mutations=st.lists(
        st.tuples(
            st.sampled_from(PATHS), st.sampled_from(["replace", "replace", "delete", "extra"]), JUNK
        ),
        min_size=1,
        max_size=3,
    )
)
def test_mutated_configs_validate_or_fail_in_one_line(mutations):
    data = copy.deepcopy(BASE)
    for path, action, value in mutations:
        try:
            _mutate(data, path, action, value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or replaced this path
    try:
        config = RunConfig.from_dict(data)
    except ConfigError as err:
        message = str(err)
        assert message.startswith("invalid config: ") and "\n" not in message, message
        assert len(message) < 2000
    else:
        # What validates once validates again from its own YAML.
        assert RunConfig.from_dict(yaml.safe_load(config.to_yaml())) == config


def test_resume_requests_that_cannot_be_followed_are_one_line(tokenizer_dir, tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tokenizer_dir, tmp_path / "run")))
    cases = [
        (["run", "--resume", str(tmp_path / "no-run")], ("config.yaml is missing", "--resume DIR")),
        (
            ["run", str(config), "--resume", str(tmp_path)],
            ("--resume DIR alone", "CONFIG --out DIR --resume"),
        ),
        (["run"], ("give a run config", "--resume DIR")),
    ]
    for argv, expect in cases:
        assert cli_main(argv) == 2
        error = capsys.readouterr().err.strip()
        assert "\n" not in error and all(text in error for text in expect), error
    assert not (tmp_path / "run").exists()
