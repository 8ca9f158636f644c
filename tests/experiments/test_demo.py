"""`dynamics demo` end to end at reduced size: a seconds-long base model, 16 steps."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from dynamics.cli import main as cli_main
from dynamics.core.rules.lp_candidate import LpCandidateParams
from dynamics.data.loading import DataError
from dynamics.experiments.base_model import QUICK_SPEC
from dynamics.experiments.demo import DemoSettings, fixed_runs, run_demo, train_all
from dynamics.runs.rundir import read_run
from tests.engine.test_run import tiny_config

pytestmark = pytest.mark.slow

SMALL = DemoSettings(
    quick=True, base_spec=QUICK_SPEC, total_steps=16, eval_batches=2, target_budgets=(8, 4)
)


def test_fixed_sweep_is_the_paper_grid_plus_fine_masses():
    labels = [label for label, _ in fixed_runs(DemoSettings())]
    # Equal target budgets: every proportional mixture equals a uniform one (section 4.4).
    assert labels == [f"uniform-w{w:g}" for w in (0, 0.05, 0.1, 0.2, 0.5, 0.8, 1)]
    unequal = dict(fixed_runs(DemoSettings(target_budgets=(1000, 500))))
    assert "proportional-w0" not in unequal  # w = 0 is the same mixture under both schemes
    weights = unequal["proportional-w0.2"]
    assert weights["arithmetic"] == pytest.approx(0.2 * 1000 / 1500)
    assert weights["code"] == weights["prose"] == weights["facts"] == pytest.approx(0.8 / 3)
    assert [label for label, _ in fixed_runs(SMALL)] == ["uniform-w0.05", "uniform-w0.2"]


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory):
    """The small demo with its four runs two at a time (each in its own process); its
    seconds-long base model is built once into the tests' cache (tests/conftest.py)."""
    root = tmp_path_factory.mktemp("demo")
    return root, run_demo(root / "demo", SMALL, progress=False, jobs=2)


def test_demo_writes_table_report_and_figures(small_demo):
    root, result = small_demo
    out = root / "demo"

    assert (out / "report.md").is_file() and (out / "table.txt").is_file()
    for name in ("weights", "constraints", "targets", "cost"):
        png = out / "figures" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    report = (out / "report.md").read_text()
    assert result["verdict"] in report
    for domain in ("arithmetic", "toolcall", "code-heldout", "prose-heldout", "quiz"):
        assert f"`{domain}`" in report  # every domain is explained

    # The table's numbers are the run folders' numbers, and the report names the base model.
    summary = json.loads((out / "demo.json").read_text())
    assert (
        summary["base_model"].startswith("weights SHA-256 ")
        and f"- base model: {summary['base_model']};" in report
    )
    rows = {row["label"]: row for row in summary["rows"]}
    assert set(rows) == {
        "DynaMiCS",
        "DynaMiCS (paper)",
        "fixed-uniform-w0.05",
        "fixed-uniform-w0.2",
    }
    # The headline run is the default variant, the paper's method its reference row.
    paper = read_run(out / "runs" / "dynamics-paper")
    assert rows["DynaMiCS (paper)"]["ppl_reduction"] == pytest.approx(
        paper.summary["constrained_ppl_reduction"]
    )
    assert yaml.safe_load((paper.path / "config.yaml").read_text())["method"]["variant"] == "paper"
    assert all(u.rules is None for u in paper.updates)
    assert "The paper's method (method.variant: paper, the reference): " in result["verdict"]
    dynamics = read_run(out / "runs" / "dynamics")
    assert (
        yaml.safe_load((dynamics.path / "config.yaml").read_text())["method"]["variant"] == "robust"
    )
    assert all(
        u.rules is not None and u.rules.find(LpCandidateParams).lp_candidate
        for u in dynamics.updates
    )
    assert result["verdict"].startswith("DynaMiCS (method.variant: robust): ")
    assert rows["DynaMiCS"]["ppl_reduction"] == pytest.approx(
        dynamics.summary["constrained_ppl_reduction"]
    )
    # Cost is the cost model's count, which one fixed run sets to 1; wall time only beside it.
    assert rows["DynaMiCS"]["cost"] == pytest.approx(dynamics.summary["predicted_cost"])
    assert rows["DynaMiCS"]["cost"] > 1.5
    assert rows["fixed-uniform-w0.05"]["cost"] == pytest.approx(1.0)
    assert "Wall time: the training loop's seconds" in report
    assert dynamics.domain_names == [
        "arithmetic",
        "toolcall",
        "code-heldout",
        "prose-heldout",
        "quiz",
    ]
    assert dynamics.summary["domain_metrics"][-1] == "accuracy"

    # The report lists where DynaMiCS broke each constraint, as the metrics file has it.
    first, later = dynamics.evaluations[0].eval, dynamics.evaluations[1:]
    for name in ("code-heldout", "prose-heldout", "quiz"):
        steps = [row.step for row in later if row.eval[name] > first[name]]
        assert f"- `{name}`: {', '.join(map(str, steps)) if steps else 'never'}" in report

    # Held-out constraint rows are exactly the rows pretraining held out: disjoint from training.
    train = set((out / "data" / "code.jsonl").read_text().splitlines())
    held = set((out / "data" / "code-heldout.jsonl").read_text().splitlines())
    assert train and held and not train & held


def test_the_numbers_do_not_depend_on_how_many_runs_train_at_once(small_demo, tmp_path):
    root, together = small_demo
    alone = run_demo(tmp_path / "demo", SMALL, progress=False, jobs=1)

    def numbers(result):
        return [
            {k: v for k, v in row.items() if k not in ("wall_seconds", "wall_ratio")}
            for row in result["rows"]
        ]

    assert numbers(alone) == numbers(together)
    for label in ("dynamics", "dynamics-paper", "fixed-uniform-w0.05"):
        one, two = (
            read_run(tmp_path / "demo" / "runs" / label),
            read_run(root / "demo" / "runs" / label),
        )
        assert [(e.eval, e.test) for e in one.evaluations] == [
            (e.eval, e.test) for e in two.evaluations
        ]
        assert [u.weights.tolist() for u in one.updates] == [
            u.weights.tolist() for u in two.updates
        ]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failed_run_is_named_and_no_further_run_starts(tmp_path, tokenizer_dir, jobs):
    bad = {
        "datasets": [{"name": "math", "path": str(tmp_path / "missing.jsonl"), "role": "target"}]
    }
    configs = {f"bad-{i}": {**bad, "output_dir": str(tmp_path / f"bad-{i}")} for i in range(2)}
    configs.update(
        {f"good-{i}": tiny_config(tokenizer_dir, tmp_path / f"good-{i}") for i in range(2)}
    )
    with pytest.raises(DataError, match=r"missing\.jsonl") as failure:
        train_all(configs, jobs=jobs, progress=False)
    assert any(re.fullmatch(r"in demo run 'bad-[01]'", note) for note in failure.value.__notes__)
    # A run starts only when one finishes: the valid runs behind the failed ones never start.
    assert not (tmp_path / "good-0").exists() and not (tmp_path / "good-1").exists()


def test_jobs_below_one_is_refused(capsys):
    assert cli_main(["demo", "--jobs", "0"]) == 2
    assert "--jobs must be at least 1 (got 0)" in capsys.readouterr().err
