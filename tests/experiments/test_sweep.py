"""``dynamics sweep`` on a local Ray instance and ``dynamics report`` on what it wrote.

The sweep is small: two configs (two learning rates) x DynaMiCS and two fixed mixtures,
one seed, 8 steps of the tiny model of examples/tiny-run.yaml with one evaluation batch.
Ray starts once for the module (2 CPUs, one core and one torch thread per task); without
the optional extra ``ray`` those tests are skipped and the others still run.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from dynamics.cli import main as cli
from dynamics.core import metrics
from dynamics.data.scenarios import DATASETS, load_scenario
from dynamics.experiments.sweep import (
    ERROR_FILE,
    SWEEP_FILE,
    Resources,
    SweepError,
    _check_fits,
    execute_run,
    plan_sweep,
    read_sweep_file,
    run_sweep,
    scenario_datasets,
    task_options,
)
from dynamics.report.text import run_report
from dynamics.runs import rundir

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tiny_base(folder: Path) -> Path:
    """examples/tiny-run.yaml with its repository-relative paths made absolute."""
    config = yaml.safe_load((ROOT / "examples" / "tiny-run.yaml").read_text())
    config["model"]["tokenizer"] = str(ROOT / config["model"]["tokenizer"])
    for dataset in config["datasets"]:
        dataset["path"] = str(ROOT / dataset["path"])
    path = folder / "base.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


SWEEP = {
    "base": "base.yaml",
    "overrides": [
        "training.total_steps=8",
        "evaluation.interval=4",
        "evaluation.batches=1",
        "evaluation.reduced_batches=1",
    ],
    "configs": {"lr3e-3": [], "lr1e-3": ["optimizer.lr=1.0e-3"]},
    "methods": {
        "dynamics": {"schedules": [[0, 4]]},
        "fixed": {"schemes": ["uniform"], "target_masses": [0.2, 0.8]},
    },
    "seeds": [0],
    "resources": {"cpus": 1},
}


def write_sweep(folder: Path, **changes) -> Path:
    tiny_base(folder)
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, **changes}, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024**2, log_to_driver=False
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def swept(local_ray, tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("sweep")
    sweep_path = write_sweep(folder)
    lines: list[str] = []
    record = run_sweep(
        read_sweep_file(sweep_path),
        folder / "out",
        sweep_dir=folder,
        use_ray=True,
        echo=lines.append,
    )
    assert "6 runs" in lines[0] and "6 to start" in lines[0] and "on Ray" in lines[0], lines
    return folder, record


@pytest.mark.slow  # Ray
def test_sweep_writes_one_finished_run_folder_per_config_method_and_seed(swept):
    folder, record = swept
    names = sorted(row["name"] for row in record["runs"])
    assert names == sorted(
        f"{config}/{method}/seed0"
        for config in ("lr3e-3", "lr1e-3")
        for method in ("dynamics-steps0-4", "fixed-uniform-w0.2", "fixed-uniform-w0.8")
    )
    assert [row["status"] for row in record["runs"]] == ["done"] * 6, record
    # One core and one thread per Ray task: torch's and OpenMP's, set before torch started.
    assert {(row["torch_threads"], row["environment_threads"]) for row in record["runs"]} == {
        (1, "1")
    }
    assert json.loads((folder / "out" / SWEEP_FILE).read_text()) == json.loads(json.dumps(record))
    for row in record["runs"]:
        run = rundir.read_run(row["path"])
        config = yaml.safe_load((Path(row["path"]) / rundir.CONFIG_FILE).read_text())
        assert config["training"]["seed"] == 0 and config["training"]["total_steps"] == 8
        assert run.summary["constrained_ppl_reduction"] == row["constrained_ppl_reduction"]
    lr = yaml.safe_load(
        (folder / "out" / "lr1e-3" / "fixed-uniform-w0.2" / "seed0" / "config.yaml").read_text()
    )
    assert lr["optimizer"]["lr"] == 1e-3
    assert lr["method"] == {
        **lr["method"],
        "name": "fixed",
        "weights": {"math": 0.2, "wiki": 0.4, "chat": 0.4},
    }


@pytest.mark.slow  # Ray
def test_rerun_skips_complete_runs_and_resumes_an_interrupted_one_without_ray(swept):
    folder, _ = swept
    interrupted = folder / "out" / "lr3e-3" / "dynamics-steps0-4" / "seed0"
    before = json.loads((interrupted / rundir.SUMMARY_FILE).read_text())
    # What a kill after the step-4 resume point leaves: no summary, a resume point.
    (interrupted / rundir.SUMMARY_FILE).unlink()
    assert (interrupted / "last_checkpoint").is_dir()
    lines: list[str] = []
    record = run_sweep(
        read_sweep_file(folder / "sweep.yaml"),
        folder / "out",
        sweep_dir=folder,
        use_ray=False,
        echo=lines.append,
    )
    assert "5 complete (skipped), 1 to resume, 0 to start" in lines[0], lines
    statuses = {row["name"]: row["status"] for row in record["runs"]}
    assert statuses.pop("lr3e-3/dynamics-steps0-4/seed0") == "done"
    assert set(statuses.values()) == {"complete"}
    # The skipped runs keep their results in sweep.json, read from their folders.
    for row in record["runs"]:
        summary = json.loads((Path(row["path"]) / rundir.SUMMARY_FILE).read_text())
        assert row["constrained_ppl_reduction"] == summary["constrained_ppl_reduction"]
        assert row["feasible"] == summary["feasible"]
    after = json.loads((interrupted / rundir.SUMMARY_FILE).read_text())
    assert after["resumed_at"] == [4]
    assert after["constrained_ppl_reduction"] == before["constrained_ppl_reduction"]


@pytest.mark.slow  # Ray
def test_sweep_report_has_the_papers_numbers_and_a_self_contained_page(swept):
    folder, _ = swept
    out = folder / "report"
    assert cli(["report", str(folder / "out"), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert sorted(report["scenarios"]) == ["lr1e-3", "lr3e-3"]
    assert list(report["methods"]) == ["dynamics-steps0-4"]
    # The oracle best and best@k, recomputed here from the summaries alone.
    for name, entry in report["scenarios"].items():
        fixed = [
            json.loads((folder / "out" / name / m / "seed0" / "summary.json").read_text())
            for m in ("fixed-uniform-w0.2", "fixed-uniform-w0.8")
        ]
        reductions = [s["constrained_ppl_reduction"] for s in fixed]
        assert entry["fixed"]["oracle_reduction"] == pytest.approx(max(reductions))
        assert entry["num_constraints"] == 2
        dyn = json.loads(
            (folder / "out" / name / "dynamics-steps0-4" / "seed0" / "summary.json").read_text()
        )
        assert (
            entry["methods"]["dynamics-steps0-4"]["reduction"] == dyn["constrained_ppl_reduction"]
        )
        assert entry["methods"]["dynamics-steps0-4"]["predicted_cost"] == dyn["predicted_cost"]
    pools = [
        [r["reduction"] for r in report["runs"] if r["method"] == "fixed" and f"/{n}/" in r["path"]]
        for n in ("lr1e-3", "lr3e-3")
    ]
    assert report["fixed"]["best_at_k"]["2"] == pytest.approx(
        float(np.median([metrics.best_at_k(p, 2) for p in pools]))
    )
    assert list(report["by_constraints"]) == ["2"]
    figures = report["figures"]
    assert set(figures) == {
        "reduction",
        "cost",
        "by_constraints",
        "violation",
        "weights:dynamics-steps0-4",
    }
    page = (out / "index.html").read_text()
    for name in figures.values():
        png = (out / name).read_bytes()
        assert png.startswith(PNG_MAGIC)
        assert base64.b64encode(png).decode() in page  # embedded, not linked
    assert not re.search(r"<script|<link|https?://|src=\"(?!data:)", page)


@pytest.mark.slow  # Ray
def test_single_run_report_draws_weights_losses_slack_and_predictions(swept, capsys):
    folder, _ = swept
    run = folder / "out" / "lr3e-3" / "dynamics-steps0-4" / "seed0"
    out = folder / "run-report"
    assert cli(["report", str(run), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["figures"]) == {"weights", "losses", "slack", "predictions"}
    records = rundir.read_run(run)
    assert report["steps"] == [0, 4, 8]
    assert report["eval"]["mmlu"] == [
        -row.eval["mmlu"] for row in records.evaluations
    ]  # shown as accuracy
    assert [u["step"] for u in report["updates"]] == [0, 4]
    assert report["updates"][0]["realized"]["math"] == records.updates[0].realized_losses[0]
    page = (out / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    # Without --out the text report is unchanged.
    capsys.readouterr()
    assert cli(["report", str(run)]) == 0
    assert capsys.readouterr().out == run_report(records) + "\n"


@pytest.mark.slow  # Ray
def test_fixed_run_report_says_it_predicts_nothing(swept):
    folder, _ = swept
    out = folder / "fixed-report"
    run = folder / "out" / "lr3e-3" / "fixed-uniform-w0.2" / "seed0"
    assert cli(["report", str(run), "--out", str(out)]) == 0
    assert "predictions" not in json.loads((out / "report.json").read_text())["figures"]
    assert "No predictions" in (out / "index.html").read_text()


# --- the sweep file, without training --------------------------------------------------


def test_the_example_sweep_plans_28_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    sweep = read_sweep_file(ROOT / "examples" / "tiny-sweep.yaml")
    plan = plan_sweep(sweep, Path("runs/tiny-sweep"), ROOT / "examples")
    assert len(plan.runs) == 2 * (2 + 5) * 2
    assert plan.notes == [
        f"{c}: gradient alignment left out: it cannot keep the accuracy constraints ['mmlu']"
        for c in ("lr3e-3", "lr1e-3")
    ]
    assert all(Path(d["path"]).is_file() for r in plan.runs for d in r.config["datasets"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"methods": {"dynamic": {}}},
            "methods.dynamic: unknown field; check the spelling (see docs/sweeps.md",
        ),
        ({"methods": {}}, "name at least one of dynamics, fixed, gradient_alignment"),
        ({"configs": {"a/b": []}}, "config names become folder names"),
        ({"seeds": [0, 0]}, "give distinct seeds"),
        (
            {"methods": {"fixed": {"target_masses": [1.5]}}},
            "methods.fixed.target_masses: give target masses in [0, 1]",
        ),
        ({"resources": {"cpus": 0}}, "resources.cpus: Input should be greater than or equal to 1"),
    ],
)
def test_bad_sweep_files_name_the_field(tmp_path, change, message):
    path = write_sweep(tmp_path, **change)
    with pytest.raises(SweepError, match=re.escape(message)):
        read_sweep_file(path)


def test_a_bad_config_names_the_config_and_the_field(tmp_path):
    path = write_sweep(tmp_path, overrides=["training.total_steps=0"])
    with pytest.raises(
        SweepError, match=r"config lr3e-3: invalid config: training.total_steps: Input should be"
    ):
        plan_sweep(read_sweep_file(path), tmp_path / "out", tmp_path)


def test_a_bad_run_config_names_the_run_and_the_field(tmp_path):
    path = write_sweep(tmp_path, methods={"dynamics": {"schedules": [[0, 4], [0, 100]]}})
    with pytest.raises(
        SweepError,
        match=r"run lr3e-3/dynamics-steps0-100/seed0: invalid config: method.schedule: "
        r"schedule step 100 is not before the end of training \(8 steps\)",
    ):
        plan_sweep(read_sweep_file(path), tmp_path / "out", tmp_path)


def test_cli_reports_a_bad_sweep_file_in_one_line(tmp_path, capsys):
    path = write_sweep(tmp_path, seeds=[])
    assert cli(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "seeds: List should have at least 1 item" in capsys.readouterr().err


def test_scenario_datasets_take_roles_budgets_and_metrics_from_the_papers_table():
    sources = {abbrev: {"path": f"/data/{abbrev}.jsonl"} for abbrev in DATASETS}
    entries = scenario_datasets("paper/s51", sources)
    scenario = load_scenario("paper/s51")
    assert [e["name"] for e in entries] == [d.abbrev for d in scenario.fine_tuning_datasets] + [
        c.abbrev for c in scenario.constraints
    ]
    for entry, spec in zip(entries, scenario.fine_tuning_datasets, strict=False):
        assert entry["budget"] == spec.budget
    accuracy = {c.abbrev for c in scenario.constraints if c.metric == "accuracy"}
    assert accuracy
    for entry in entries[len(scenario.fine_tuning_datasets) :]:
        assert entry["role"] == "constraint"
        assert (entry.get("metric") == "accuracy") == (entry["name"] in accuracy)
    with pytest.raises(SweepError, match=r"scenarios.datasets: paper/s51 needs rows for \["):
        scenario_datasets("paper/s51", {})


def test_a_failing_run_is_reported_and_the_others_go_on(tmp_path, capsys):
    path = write_sweep(
        tmp_path, configs={"ok": [], "broken": []}, methods={"fixed": {"target_masses": [1.0]}}
    )
    # The broken config reads an empty file for its target: the run fails when it loads it.
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    sweep = yaml.safe_load(path.read_text())
    sweep["configs"]["broken"] = [f"datasets.math.path={empty}"]
    sweep["overrides"] += ["training.total_steps=2", "evaluation.interval=2"]
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    assert cli(["sweep", str(path), "--out", str(tmp_path / "out"), "--no-ray"]) == 1
    out = capsys.readouterr().out
    assert (
        "broken/fixed-uniform-w1/seed0: FAILED: " in out
        and "1 finished now, 0 were already complete, 1 failed" in out
    )
    record = json.loads((tmp_path / "out" / SWEEP_FILE).read_text())
    statuses = {row["name"]: row["status"] for row in record["runs"]}
    assert statuses == {
        "ok/fixed-uniform-w1/seed0": "done",
        "broken/fixed-uniform-w1/seed0": "failed",
    }
    failed = next(row for row in record["runs"] if row["status"] == "failed")
    error_file = Path(failed["path"]) / ERROR_FILE
    assert failed["error_file"] == str(error_file) and failed["error"].endswith(
        f"(traceback in {error_file})"
    )
    assert error_file.read_text().startswith("Traceback (most recent call last)")


@pytest.mark.slow  # Ray
def test_a_run_no_node_can_hold_is_refused_instead_of_waiting_forever(local_ray):
    import ray

    nodes = ray.nodes()  # the local instance: 2 CPUs, no GPU
    _check_fits(nodes, Resources(cpus=2), None)
    with pytest.raises(
        SweepError,
        match=r"resources: each run asks for 1 GPUs and 1 CPU cores, but no node of the "
        r"local Ray instance has that much \(the largest: 0 GPUs, 2 cores\)",
    ):
        _check_fits(nodes, Resources(gpus=1), None)
    with pytest.raises(SweepError, match="asks for 0 GPUs and 3 CPU cores"):
        _check_fits(nodes, Resources(cpus=3), None)


def test_a_scenario_sweep_plans_the_papers_grid_with_the_scenarios_budgets(tmp_path):
    tiny_base(tmp_path)
    sources = {
        abbrev: {"path": str(tmp_path / f"{abbrev}.jsonl"), "format": "instruction"}
        for abbrev in DATASETS
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "base": "base.yaml",
                # The base config's alignment_batches carries over to the sweep's
                # gradient alignment.
                "overrides": ["method.alignment_batches=4"],
                "scenarios": {"names": ["paper/s28"], "datasets": sources},
                "methods": {
                    "dynamics": {},
                    "fixed": {},
                    "gradient_alignment": {"schedules": ["no-warmup"]},
                },
                "seeds": [0, 1],
            },
            sort_keys=False,
        )
    )
    plan = plan_sweep(read_sweep_file(path), tmp_path / "out", tmp_path)
    scenario = load_scenario("paper/s28")
    assert [d.budget for d in scenario.targets] == [1000, 300]
    assert {r.config_name for r in plan.runs} == {"paper-s28"}
    # Two targets with unequal budgets: 5 uniform mixtures and 4 proportional ones (at w = 0
    # both schemes give all the mass to the non-targets): the paper's 9 baselines, x 2 seeds.
    fixed = sorted({r.method for r in plan.runs if r.method.startswith("fixed-")})
    assert len(fixed) == 9 and "fixed-proportional-w0" not in fixed
    assert len(plan.runs) == 2 * (
        1 + 9 + 1
    )  # s28 constrains losses only: gradient alignment runs too
    alignment = next(r for r in plan.runs if r.method == "gradient-alignment-no-warmup").config[
        "method"
    ]
    assert (alignment["name"], alignment["schedule"], alignment["alignment_batches"]) == (
        "gradient-alignment",
        "no-warmup",
        4,
    )
    weights = next(r for r in plan.runs if r.method == "fixed-proportional-w0.5").config["method"][
        "weights"
    ]
    assert weights == pytest.approx(
        {"NM": 0.5 * 1000 / 1300, "GF": 0.5 * 300 / 1300, "WP": 0.25, "FW": 0.25}
    )
    first = plan.runs[0].config
    assert [d["name"] for d in first["datasets"]] == [
        d.abbrev for d in scenario.fine_tuning_datasets
    ] + [c.abbrev for c in scenario.constraints]
    assert (
        plan.runs[0].path
        == (tmp_path / "out" / "paper-s28" / "dynamics-dense-warmup" / "seed0").resolve()
    )


def test_proportional_alone_plans_its_runs_even_where_they_equal_uniform_ones(tmp_path):
    # One target: every proportional mixture equals the uniform one of the same mass.
    path = write_sweep(
        tmp_path,
        overrides=[*SWEEP["overrides"], "datasets.math.budget=100"],
        methods={"fixed": {"schemes": ["proportional"], "target_masses": [0.2, 0.8]}},
    )
    plan = plan_sweep(read_sweep_file(path), tmp_path / "out", tmp_path)
    assert plan.notes == []
    assert sorted({r.method for r in plan.runs}) == [
        "fixed-proportional-w0.2",
        "fixed-proportional-w0.8",
    ]
    weights = next(r for r in plan.runs if r.method == "fixed-proportional-w0.2").config["method"][
        "weights"
    ]
    assert weights == pytest.approx({"math": 0.2, "wiki": 0.4, "chat": 0.4})
    # Both schemes: the proportional duplicates of the uniform mixtures are skipped.
    path = write_sweep(
        tmp_path,
        overrides=[*SWEEP["overrides"], "datasets.math.budget=100"],
        methods={"fixed": {"target_masses": [0.2, 0.8]}},
    )
    plan = plan_sweep(read_sweep_file(path), tmp_path / "out", tmp_path)
    assert sorted({r.method for r in plan.runs}) == ["fixed-uniform-w0.2", "fixed-uniform-w0.8"]


def test_proportional_without_budgets_is_left_out_with_a_note(tmp_path):
    path = write_sweep(
        tmp_path,
        methods={"fixed": {"schemes": ["uniform", "proportional"], "target_masses": [0.2]}},
    )
    plan = plan_sweep(read_sweep_file(path), tmp_path / "out", tmp_path)
    assert [r.method for r in plan.runs] == ["fixed-uniform-w0.2"] * 2
    assert plan.notes == [
        f"{config}: fixed proportional runs left out: the targets ['math'] have no budget "
        "(give each target dataset a budget, or use schemes: [uniform])"
        for config in ("lr3e-3", "lr1e-3")
    ]


@pytest.mark.parametrize(
    ("dynamics", "message"),
    [
        (
            {"schedules": [[0, 4], [0, 4]]},
            "methods.dynamics.schedules: the sweep plans run lr3e-3/dynamics-steps0-4 "
            "twice (both would write {out}/lr3e-3/dynamics-steps0-4/seed0): remove "
            "the repeated entries [[0, 4]]",
        ),
        (
            {"schedules": [[0, 4]], "variants": ["paper", "paper"]},
            "methods.dynamics.variants: ",
        ),
        (
            {"schedules": [[0, 4]], "predictors": ["curve", "curve"]},
            "methods.dynamics.predictors: ",
        ),
    ],
)
def test_repeated_methods_are_refused_instead_of_sharing_a_folder(tmp_path, dynamics, message):
    path = write_sweep(tmp_path, methods={"dynamics": dynamics})
    out = (tmp_path / "out").resolve()
    with pytest.raises(SweepError, match=re.escape(message.format(out=out))):
        plan_sweep(read_sweep_file(path), tmp_path / "out", tmp_path)


def test_a_repeated_scenario_is_refused_instead_of_sharing_a_folder(tmp_path):
    tiny_base(tmp_path)
    sources = {
        abbrev: {"path": str(tmp_path / f"{abbrev}.jsonl"), "format": "instruction"}
        for abbrev in DATASETS
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "base": "base.yaml",
                "scenarios": {"names": ["paper/s28", "paper/s28"], "datasets": sources},
                "methods": {"dynamics": {}},
            },
            sort_keys=False,
        )
    )
    with pytest.raises(
        SweepError,
        match=r"^scenarios.names: the sweep plans run paper-s28/dynamics-dense-warmup "
        r"twice \(.*\): remove the repeated scenarios \['paper/s28'\]$",
    ):
        plan_sweep(read_sweep_file(path), tmp_path / "out", tmp_path)


def test_ray_tasks_are_not_retried_and_cpu_runs_see_no_gpu():
    cpu = task_options(Resources(cpus=2))
    assert cpu["num_cpus"] == 2 and cpu["num_gpus"] == 0 and cpu["max_retries"] == 0
    assert cpu["runtime_env"]["env_vars"] == {
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "",
    }
    # A GPU task: Ray itself points CUDA_VISIBLE_DEVICES at the GPU it assigns.
    gpu = task_options(Resources(gpus=1, cpus=1))
    assert gpu["num_gpus"] == 1 and gpu["max_retries"] == 0
    assert "CUDA_VISIBLE_DEVICES" not in gpu["runtime_env"]["env_vars"]


def test_a_failed_run_leaves_its_traceback_and_a_rerun_is_not_blocked_by_it(tmp_path, monkeypatch):
    planned = plan_sweep(read_sweep_file(write_sweep(tmp_path)), tmp_path / "out", tmp_path).runs[0]

    def failing_run(config, progress, resume):
        rundir.check_run_dir(config.output_dir)  # as the engine does before a new run
        raise ValueError("the data\nis bad")

    monkeypatch.setattr("dynamics.engine.run.run", failing_run)
    error_file = planned.path / ERROR_FILE
    first = execute_run(planned.config, False, 1)
    assert first["error"] == f"ValueError: the data is bad (traceback in {error_file})"
    assert first["error_file"] == str(error_file)
    traceback_text = error_file.read_text()
    assert (
        traceback_text.startswith("Traceback (most recent call last)")
        and "in failing_run" in traceback_text
    )
    # The next attempt starts in a folder holding only the old error.txt: it fails for its own
    # reason again, not with "output folder is not empty".
    second = execute_run(planned.config, False, 1)
    assert second["error"] == first["error"]
    assert sorted(p.name for p in planned.path.iterdir()) == [ERROR_FILE]
