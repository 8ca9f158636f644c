"""The scenario families of ``benchmarks/scenario_families.py``, without training: the
generator, the new domains' answers, the configs, the frozen evaluation split, and the
baselines and goal computed from hand-written run results."""

from __future__ import annotations

import calendar
import csv
import datetime
import io
import json
import re
import subprocess
import sys
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

from dynamics.core.cost import CostModel, run_cost
from dynamics.core.schedules import build_schedule
from dynamics.data import build_examples, load_rows, offline
from dynamics.engine.config import RunConfig
from dynamics.experiments.base_model import QUICK_SPEC, domain_paths, ensure_base_model

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(
        0, str(BENCHMARKS)
    )  # the benchmark scripts import their sibling modules by name

import families_domains as domains  # noqa: E402
import scenario_families as families  # noqa: E402
from scenario_families import FamilyScenario  # noqa: E402

ALL_SEEDS = range(200)


@pytest.fixture(scope="module")
def demo_quiz(tmp_path_factory) -> Path:
    """The demo's quiz, 12 questions (all its domains written at their smallest)."""
    folder = tmp_path_factory.mktemp("demo")
    sizes = offline.DomainSizes(code=1, prose=1, arithmetic=1, toolcall=1, quiz=12)
    return offline.write_offline_domains(folder, 0, sizes)["quiz"]


# --- the generator -----------------------------------------------------------------------


def test_the_same_seed_draws_the_same_scenario_and_byte_identical_files(tmp_path, demo_quiz):
    assert [families.draw_scenario(s) for s in ALL_SEEDS] == [
        families.draw_scenario(s) for s in ALL_SEEDS
    ]
    assert len({families.draw_scenario(s).targets for s in ALL_SEEDS}) > 20  # the seeds do draw
    first = domains.write_family_domains(tmp_path / "a", 3, demo_quiz, rows=50)
    again = domains.write_family_domains(tmp_path / "b", 3, demo_quiz, rows=50)
    other = domains.write_family_domains(tmp_path / "c", 4, demo_quiz, rows=50)
    assert list(first) == list(domains.NEW_DOMAINS)
    for name in domains.NEW_DOMAINS:
        assert first[name].read_bytes() == again[name].read_bytes(), name
        assert len(first[name].read_text().splitlines()) == (12 if name == "modules_quiz" else 50)
    for name in domains.GENERATED:
        assert first[name].read_bytes() != other[name].read_bytes(), name


def test_roles_stay_in_their_ranges_and_never_share_a_domain():
    for seed in ALL_SEEDS:
        s = families.draw_scenario(seed)
        assert 1 <= len(s.targets) <= 4 and set(s.targets) <= set(families.SKILLS), s
        assert 0 <= len(s.non_targets) <= 3, s
        assert set(s.non_targets) <= {*families.GENERAL_TEXT, *families.SKILLS}, s
        assert 1 <= len(s.constraints) <= 4, s
        assert set(s.loss_constraints) <= {*families.HELD_OUT_TEXT, *families.SKILLS}, s
        assert set(s.accuracy_constraints) <= set(families.QUIZZES), s
        roles = [*s.targets, *s.non_targets, *s.constraints]
        assert len(roles) == len(set(roles)), s
        assert len(s.budgets) == len(s.targets) and set(s.budgets) <= set(families.TARGET_BUDGETS)
        assert 0.5e-4 <= s.lr <= 3e-4 and 128 <= s.steps <= 512 and s.steps % 16 == 0
    drawn = [families.draw_scenario(s) for s in ALL_SEEDS]
    assert {len(s.targets) for s in drawn} == {1, 2, 3, 4}
    assert {len(s.non_targets) for s in drawn} == {0, 1, 2, 3}
    assert {len(s.constraints) for s in drawn} == {1, 2, 3, 4}
    assert (
        min(s.lr for s in drawn) < 0.6e-4 and max(s.lr for s in drawn) > 2.5e-4
    )  # the range is used


def test_half_of_each_split_has_an_accuracy_constraint():
    for seeds in (families.DEVELOPMENT, families.EVALUATION):
        with_accuracy = [s for s in seeds if families.draw_scenario(s).accuracy_constraints]
        assert len(with_accuracy) == 50
    # Loss constraints come with and without accuracy ones.
    assert any(families.draw_scenario(s).loss_constraints for s in range(0, 200, 2))


def test_most_constraints_bring_the_text_they_were_learnt_from_but_not_all():
    drawn = [families.draw_scenario(s) for s in ALL_SEEDS]
    pairs = [(s, families.REPLAY[c]) for s in drawn for c in s.constraints if c in families.REPLAY]
    replayed = sum(text in s.non_targets for s, text in pairs)
    assert 0.6 < replayed / len(pairs) < 0.95  # 3 in 4 drawn, fewer where the quizzes share one
    # Held-out text is the more common loss constraint, and untrained skills are drawn too.
    loss = [c for s in drawn for c in s.loss_constraints]
    held_out = sum(c in families.HELD_OUT_TEXT for c in loss)
    assert len(loss) / 2 < held_out < len(loss)


def test_seeds_are_split_into_development_and_evaluation():
    assert families.split_of(0) == families.split_of(99) == "development"
    assert families.split_of(100) == families.split_of(199) == "evaluation"
    for seed in (-1, 200):
        with pytest.raises(ValueError, match=r"use 0-99 \(development\) or 100-199 \(evaluation\)"):
            families.draw_scenario(seed)
    assert families.parse_seeds("0-3,2,100") == [0, 1, 2, 3, 100]
    with pytest.raises(ValueError, match="'5-3' names no seed"):
        families.parse_seeds("5-3")


# --- the new domains' answers, recomputed ------------------------------------------------


def rows_of(generate, count: int = 400, seed: str = "test") -> list[dict]:
    rng = __import__("random").Random(seed)
    return [generate(rng) for _ in range(count)]


def test_string_answers_are_right():
    kinds = set()
    for row in rows_of(domains.strings_row):
        if m := re.fullmatch(r'Reverse the string "([a-z ]+)"\.', row["prompt"]):
            phrase = m[1]
            assert row["response"].endswith(f'"{"".join(reversed(phrase))}".'), row
        elif m := re.fullmatch(r'Write "([a-z ]+)" in uppercase\.', row["prompt"]):
            upper = "".join(chr(ord(c) - 32) if c != " " else c for c in m[1])
            assert row["response"].endswith(f'"{upper}".'), row
        else:
            m = re.fullmatch(
                r'How many times does the letter "([a-z])" appear in "([a-z ]+)"\?', row["prompt"]
            )
            assert m is not None, row
            count = sum(1 for c in m[2] if c == m[1])
            assert re.search(rf"appears {count} times? in", row["response"]), row
        kinds.add(row["prompt"].split()[0])
    assert kinds == {"Reverse", "Write", "How"}


# Every unit in a base unit (mm, g, s, mL), written out apart from the generator's table.
IN_BASE_UNITS = {
    "mm": Fraction(1), "cm": Fraction(10), "m": Fraction(1000), "km": Fraction(10**6),
    "in": Fraction(254, 10), "ft": Fraction(3048, 10), "yd": Fraction(9144, 10),
    "mi": Fraction(1609344),
    "g": Fraction(1), "kg": Fraction(1000), "t": Fraction(10**6),
    "oz": Fraction(45359237, 16 * 10**5), "lb": Fraction(45359237, 10**5),
    "s": Fraction(1), "min": Fraction(60), "h": Fraction(3600), "day": Fraction(86400),
    "week": Fraction(604800),
    "mL": Fraction(1), "L": Fraction(1000), "qt": Fraction(946352946, 10**6),
    "gal": Fraction(3785411784, 10**6),
}  # fmt: skip


def test_unit_conversions_are_right():
    for row in rows_of(domains.units_row):
        m = re.fullmatch(r"Convert (\d+) (\w+) to (\w+)\.", row["prompt"])
        assert m is not None, row
        amount, unit, into = int(m[1]), m[2], m[3]
        answer = re.search(rf"= (\d+) {into}\.$", row["response"])
        assert answer is not None, row
        assert amount * IN_BASE_UNITS[unit] == int(answer[1]) * IN_BASE_UNITS[into], row
    # Both directions of every conversion are drawn.
    pairs = {
        tuple(re.findall(r"Convert \d+ (\w+) to (\w+)", r["prompt"])[0])
        for r in rows_of(domains.units_row, 2000)
    }
    assert len(pairs) == 2 * len(domains.CONVERSIONS)


def test_date_answers_are_right():
    kinds = set()
    for row in rows_of(domains.dates_row):
        prompt, response = row["prompt"], row["response"]
        if m := re.fullmatch(r"What date is (\d+) days (after|before) (\S+)\?", prompt):
            days = int(m[1]) if m[2] == "after" else -int(m[1])
            expected = datetime.date.fromordinal(
                datetime.date.fromisoformat(m[3]).toordinal() + days
            )
            assert response.endswith(f" is {expected.isoformat()}."), row
        elif m := re.fullmatch(r"How many days are there from (\S+) to (\S+)\?", prompt):
            first, last = (datetime.date.fromisoformat(d).toordinal() for d in (m[1], m[2]))
            assert response.endswith(f" there are {last - first} days."), row
        else:
            m = re.fullmatch(r"What day of the week is (\d+)-(\d+)-(\d+)\?", prompt)
            assert m is not None, row
            weekday = calendar.day_name[calendar.weekday(int(m[1]), int(m[2]), int(m[3]))]
            assert response.endswith(f" is a {weekday}."), row
        kinds.add(m.re.pattern[:8])
    assert len(kinds) == 3


def test_sorting_answers_are_right():
    kinds = set()
    for row in rows_of(domains.sorting_row):
        if m := re.fullmatch(r"Sort in (ascending|descending) order: ([\d, ]+)\.", row["prompt"]):
            numbers = [int(n) for n in m[2].split(", ")]
            expected = sorted(numbers, reverse=m[1] == "descending")
            assert [int(n) for n in row["response"].split(", ")] == expected, row
            kinds.add(m[1])
        else:
            m = re.fullmatch(r"Sort alphabetically: ([a-z, ]+)\.", row["prompt"])
            assert m is not None, row
            assert row["response"].split(", ") == sorted(m[1].split(", ")), row
            kinds.add("words")
    assert kinds == {"ascending", "descending", "words"}


def test_records_are_csv_tables_or_json_objects():
    kinds = set()
    for row in rows_of(domains.records_row):
        text = row["text"]
        if text.startswith("{"):
            record = json.loads(text)
            kinds.add("json")
        else:
            table = list(csv.DictReader(io.StringIO(text)))
            assert 2 <= len(table) <= 5
            record = table[0]
            kinds.add("csv")
        assert set(record) == {"id", "customer", "city", "item", "quantity", "price", "currency"}
    assert kinds == {"csv", "json"}


def test_the_modules_quiz_asks_the_demo_quiz_facts_by_module(demo_quiz):
    demo = [json.loads(line) for line in demo_quiz.read_text().splitlines()]
    facts = {(f.module, f.kind, f.name) for f in offline.quiz_facts(offline.stdlib_sources())}
    for row in demo:
        asked = domains.modules_quiz_row(row)
        m = re.fullmatch(
            r"In which module is the (function|class) `(\w+)` defined\?", asked["question"]
        )
        assert m is not None, asked
        assert (
            asked["choices"][asked["answer"]],
            m[1],
            m[2],
        ) in facts  # the right module defines it
        assert len(asked["choices"]) == 4 and all("." + m[2] not in c for c in asked["choices"])
    with pytest.raises(ValueError, match="not a question of the demo's quiz"):
        domains.modules_quiz_row({"question": "What?", "choices": ["a"], "answer": 0})


# --- configs ---------------------------------------------------------------------------------


def test_every_config_of_seeds_0_to_19_validates(tmp_path):
    for seed in range(20):
        scenario = families.draw_scenario(seed)
        runs = families.plan(scenario)
        assert set(runs) >= {"robust", "paper", "fixed-w1"}
        assert len(runs) == (12 if scenario.non_targets else 3)
        for label, method in runs.items():
            config = RunConfig.from_dict(
                families.scenario_config(
                    scenario, tmp_path, tmp_path / "data", tmp_path / label, method
                )
            )
            roles = {d.name: d.role for d in config.datasets}
            assert roles == {
                **dict.fromkeys(scenario.targets, "target"),
                **dict.fromkeys(scenario.non_targets, "non-target"),
                **dict.fromkeys(scenario.constraints, "constraint"),
            }
            metrics = {d.name: d.metric for d in config.datasets if d.role == "constraint"}
            assert [n for n, m in metrics.items() if m == "accuracy"] == list(
                scenario.accuracy_constraints
            )
            assert (
                config.optimizer.lr == scenario.lr and config.training.total_steps == scenario.steps
            )
            assert config.training.seed == seed
            assert {d.name: d.budget for d in config.datasets if d.role == "target"} == dict(
                zip(scenario.targets, scenario.budgets, strict=True)
            )
            if method["name"] == "fixed":
                weights = method["weights"]
                assert sum(weights.values()) == pytest.approx(1.0)
                mass = float(label.removeprefix("fixed-w"))
                assert sum(weights[t] for t in scenario.targets) == pytest.approx(mass)
    assert (
        families.METHODS["robust"]["variant"] == "robust"
        and families.METHODS["paper"]["variant"] == "paper"
    )


@pytest.fixture(scope="module")
def quick_base() -> Path:
    """The seconds-long base model (tests/conftest.py keeps it in the tests' cache)."""
    return ensure_base_model(spec=QUICK_SPEC, progress=False)


def test_the_pool_loads_as_the_runs_read_it(tmp_path, quick_base):
    files = families.prepare_data(quick_base, tmp_path / "data")
    assert set(files) >= {
        *families.SKILLS,
        *families.GENERAL_TEXT,
        *families.HELD_OUT_TEXT,
        *families.QUIZZES,
    }
    assert files["arithmetic"] == domain_paths(quick_base)["arithmetic"]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(quick_base)
    # Each domain in each shape it takes in seeds 0-19 (the format and metric decide how its
    # rows are read and tokenized; the role only which splits are kept), loaded once.
    datasets, roles = {}, set()
    for seed in range(20):
        scenario = families.draw_scenario(seed)
        config = RunConfig.from_dict(
            families.scenario_config(
                scenario,
                quick_base,
                tmp_path / "data",
                tmp_path / "run",
                families.METHODS["robust"],
            )
        )
        datasets.update(
            {
                (d.name, d.format, d.metric): (d, config.training.sequence_length)
                for d in config.datasets
            }
        )
        roles |= {(d.name, d.role) for d in config.datasets}
    for (name, *_), (dataset, sequence_length) in datasets.items():
        source = dataset.data_source()
        rows = load_rows(source, cache_dir=tmp_path / "cache")
        examples = build_examples(rows, tokenizer, source, sequence_length=sequence_length)
        assert len(examples) > 0, name
    assert {name for name, *_ in datasets} >= {*families.SKILLS, *domains.NEW_DOMAINS}
    assert {role for name, role in roles if name in families.SKILLS} == {
        "target",
        "non-target",
        "constraint",
    }


# --- measuring: the frozen evaluation split, resuming ----------------------------------------


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository of one commit holding a src/dynamics."""
    folder = tmp_path / "repo"
    (folder / "src" / "dynamics").mkdir(parents=True)
    (folder / "src" / "dynamics" / "robust.py").write_text("VARIANT = 'robust'\n")
    git(folder, "init", "-q")
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", "the default")
    return folder


def test_a_run_label_no_scenario_plans_is_refused_before_anything_is_written(tmp_path, repo):
    out = tmp_path / "families"
    with pytest.raises(ValueError, match="--runs robsut: no scenario of these seeds"):
        families.measure_family(
            out, [0, 1], base_folder=tmp_path / "no-base", repo=repo, labels=["robust", "robsut"]
        )
    assert not out.exists()
    with pytest.raises(SystemExit):
        families.main(["--seeds", "0-1", "--runs", "robsut", "--out", str(out)])
    assert not out.exists()


@pytest.mark.parametrize("margin", ["-1", "nan"])
def test_a_selection_margin_below_0_is_refused_before_anything_is_written(tmp_path, margin, capsys):
    out = tmp_path / "families"
    with pytest.raises(SystemExit):
        families.main(["--seeds", "0", "--selection-margin", margin, "--out", str(out)])
    assert "--selection-margin" in capsys.readouterr().err and not out.exists()


def test_the_evaluation_split_refuses_to_run_without_a_frozen_commit(tmp_path, repo, capsys):
    out = tmp_path / "families"
    with pytest.raises(
        ValueError,
        match="the evaluation split: freeze the default first and give its commit with",
    ):
        families.measure_family(out, [99, 100], base_folder=tmp_path / "no-base", repo=repo)
    assert not out.exists()
    with pytest.raises(SystemExit):
        families.main(["--seeds", "150", "--out", str(out)])
    assert "--frozen-commit" in capsys.readouterr().err and not out.exists()
    evaluation = [families.draw_scenario(100)]
    with pytest.raises(ValueError, match="'abc1234' is not a commit of"):
        families.frozen_commit(evaluation, "abc1234", repo)
    head = git(repo, "rev-parse", "HEAD")
    assert families.frozen_commit(evaluation, head[:8], repo) == head
    assert (
        families.frozen_commit([families.draw_scenario(0)], None, repo) is None
    )  # development needs none
    # A library changed since the commit frozen is not the frozen default.
    (repo / "src" / "dynamics" / "robust.py").write_text(
        "VARIANT = 'tuned on the evaluation split'\n"
    )
    with pytest.raises(ValueError, match="src/dynamics differs from that of --frozen-commit"):
        families.frozen_commit(evaluation, head, repo)


def test_measuring_records_the_frozen_commit_and_resumes(tmp_path, quick_base, repo, monkeypatch):
    trained: list[list[str]] = []
    monkeypatch.setattr(
        families, "train_all", lambda configs, jobs, progress: trained.append(list(configs))
    )
    out, commit = tmp_path / "families", git(repo, "rev-parse", "HEAD")
    measure = dict(base_folder=quick_base, repo=repo, log=lambda m: None)
    families.measure_family(out, [100], frozen=commit[:10], **measure)
    scenario = families.draw_scenario(100)
    assert trained == [[f"s100 {label}" for label in families.plan(scenario)]]
    record = json.loads((out / "s100" / "scenario.json").read_text())
    assert (
        record["frozen_commit"] == record["checkout_commit"] == commit
        and record["split"] == "evaluation"
    )
    assert families.recorded_scenario(record) == scenario

    # A finished run is skipped; a crashed one (no summary.json) is removed and redone.
    (out / "s100" / "robust").mkdir()
    (out / "s100" / "robust" / "summary.json").write_text("{}")
    (out / "s100" / "paper").mkdir()
    (out / "s100" / "paper" / "half-written.jsonl").write_text("")
    families.measure_family(out, [100], frozen=commit, **measure)
    assert trained[1] == [f"s100 {label}" for label in families.plan(scenario) if label != "robust"]
    assert not (out / "s100" / "paper").exists()

    # Another default frozen later: its runs go elsewhere.
    git(repo, "commit", "-q", "--allow-empty", "-m", "another default")
    with pytest.raises(ValueError, match=f"ran at --frozen-commit {commit}, not "):
        families.measure_family(out, [100], frozen="HEAD", **measure)


# --- baselines, rule of thumb and goal, on hand-written results ------------------------------


def result(feasible, test, eval_=None, *, held=True, violation=(0.0, 0.0), cost=1.0) -> dict:
    return {
        "feasible": feasible,
        "reduction_test": test,
        "reduction_eval": test if eval_ is None else eval_,
        **({"held_test": held} if feasible else {}),
        "violation_eval": violation[0],
        "violation_test": violation[1],
        "predicted_cost": cost,
    }


TWO_TARGETS = FamilyScenario(
    seed=0, targets=("strings", "dates"), budgets=(500, 500), non_targets=("prose",),
    loss_constraints=("code-heldout",), accuracy_constraints=(), lr=1e-4, steps=128,
)  # fmt: skip
TARGETS_ONLY = FamilyScenario(
    seed=2, targets=("units",), budgets=(500,), non_targets=(),
    loss_constraints=("prose-heldout",), accuracy_constraints=(), lr=1e-4, steps=128,
)  # fmt: skip


def sweep(**given: dict) -> dict:
    """The fixed sweep of TWO_TARGETS, infeasible (reduction 0) unless given as w<mass>."""
    runs = {families.fixed_label(m): result(False, 0.0) for m in families.SWEEP_MASSES}
    runs.update({families.fixed_label(float(k[1:].replace("_", "."))): v for k, v in given.items()})
    return runs


def test_a_scenario_row_reads_the_baselines_from_its_runs():
    runs = {
        **sweep(
            w0_1=result(True, 0.28, 0.30),
            w0_2=result(True, 0.35, 0.40),
            w0_3=result(True, 0.45, 0.50),
        ),
        "robust": result(True, 0.31, held=False, cost=2.0),
        "paper": result(True, 0.20),
    }
    row = families.scenario_row(TWO_TARGETS, runs, rule_mass=0.2)
    # k = 2 draws from 10 runs, the eval-best kept: w0.3 with 1 - 0.9^2, w0.2 with 0.9^2 - 0.8^2,
    # w0.1 with 0.8^2 - 0.7^2, else an infeasible run (0).
    assert row["equal_compute"] == pytest.approx(0.19 * 0.45 + 0.17 * 0.35 + 0.15 * 0.28)
    assert row["oracle"] == pytest.approx(0.35)  # w0.3 is not one of the 8 masses
    assert row["rule_of_thumb"] == pytest.approx(0.35)
    assert (row["default"], row["paper"], row["measured_cost"]) == (0.31, 0.20, 2.0)
    # Judged at the paper's shape: dense-warmup over 2,048 steps, 3 datasets probed and 3
    # domains evaluated, whatever the run measured at its own shape.
    paper_shape = run_cost(build_schedule("dense-warmup", 2048), 3, 3, CostModel()).relative
    assert row["cost"] == pytest.approx(paper_shape) and 1.0 < row["cost"] < 2.0
    assert row["default_feasible_test"] is False and row["default_held_test"] is False
    assert row["some_fixed_feasible"] and not row["nothing_feasible"] and not row["nothing_binds"]
    assert row["targets_alone"] == 0.0 and "violation" not in row


def test_where_nothing_is_feasible_the_least_violating_fixed_run_is_the_bar():
    runs = {
        **{
            families.fixed_label(m): result(False, 0.0, violation=(0.10 + m, 0.20 + m))
            for m in families.SWEEP_MASSES
        },
        "robust": result(False, 0.0, violation=(0.05, 0.25), cost=1.5),
    }
    row = families.scenario_row(TWO_TARGETS, runs, rule_mass=None)
    assert row["nothing_feasible"] and not row["some_fixed_feasible"]
    assert (row["violation"], row["least_violation"]) == (0.25, 0.20)  # w0 violates least on eval
    assert row["rule_of_thumb"] is None and row["paper"] is None


def test_without_non_targets_every_baseline_is_the_targets_alone():
    runs = {"fixed-w1": result(True, 0.40), "robust": result(True, 0.38, cost=1.2)}
    assert list(families.fixed_plan(TARGETS_ONLY)) == ["fixed-w1"]
    row = families.scenario_row(TARGETS_ONLY, runs, rule_mass=0.05)
    assert (
        row["equal_compute"]
        == row["oracle"]
        == row["targets_alone"]
        == row["rule_of_thumb"]
        == 0.40
    )
    assert row["nothing_binds"]


def test_the_rule_of_thumb_is_the_mass_best_in_median_over_the_development_scenarios():
    dev = [
        (
            TWO_TARGETS,
            {
                **sweep(w0_05=result(True, 0.30), w0_2=result(True, 0.20)),
                "robust": result(True, 0.1),
            },
        ),
        (
            TWO_TARGETS,
            {
                **sweep(w0_05=result(True, 0.10), w0_2=result(True, 0.25)),
                "robust": result(True, 0.1),
            },
        ),
        # Without non-targets, every mass is the targets alone: 0.50 counts for 0.05 and 0.2 alike.
        (TARGETS_ONLY, {"fixed-w1": result(True, 0.50), "robust": result(True, 0.1)}),
    ]
    # Medians: w0.05 of (0.30, 0.10, 0.50) = 0.30; w0.2 of (0.20, 0.25, 0.50) = 0.25;
    # w1 of (0, 0, 0.50) = 0.
    assert families.rule_of_thumb_mass(dev) == 0.05
    evaluation = replace_seed(TWO_TARGETS, 150)
    strong = {**sweep(w0_2=result(True, 0.90)), "robust": result(True, 0.1)}
    assert (
        families.rule_of_thumb_mass([*dev, (evaluation, strong), (evaluation, strong)]) == 0.05
    )  # not fitted on
    incomplete = {**sweep(w0_2=result(True, 0.90))}  # the default did not finish
    assert (
        families.rule_of_thumb_mass([*dev, (TWO_TARGETS, incomplete), (TWO_TARGETS, incomplete)])
        == 0.05
    )
    assert families.rule_of_thumb_mass([(evaluation, strong)]) is None


def replace_seed(scenario: FamilyScenario, seed: int) -> FamilyScenario:
    return replace(scenario, seed=seed)


def row(
    default,
    *,
    equal=0.0,
    oracle=0.0,
    alone=0.0,
    rule=0.0,
    feasible=True,
    some=True,
    binds=False,
    cost=1.0,
    **extra,
):
    return {
        "default": default, "equal_compute": equal, "oracle": oracle, "targets_alone": alone,
        "rule_of_thumb": rule,
        "default_feasible_test": feasible, "some_fixed_feasible": some, "nothing_feasible": False,
        "nothing_binds": binds, "cost": cost, "measured_cost": 2 * cost, **extra,
    }  # fmt: skip


def test_the_goal_conditions_on_hand_written_rows():
    rows = [
        row(0.30, equal=0.25, oracle=0.31, rule=0.20, cost=1.5),
        row(0.20, equal=0.22, oracle=0.30, rule=0.25, feasible=False, cost=1.9),
        row(0.40, equal=0.30, oracle=0.41, alone=0.402, rule=0.30, binds=True, cost=2.5),
        row(0.35, equal=0.30, oracle=0.36, alone=0.36, rule=0.30, binds=True, cost=1.8),
        # Nothing feasible: counts only for the violation and the cost.
        row(
            0.0,
            some=False,
            feasible=False,
            cost=1.0,
            nothing_feasible=True,
            violation=0.05,
            least_violation=0.04,
        ),
        row(
            0.0,
            some=False,
            feasible=False,
            cost=1.0,
            nothing_feasible=True,
            violation=0.03,
            least_violation=0.03,
        ),
    ]
    conditions = {c.name: c for c in families.goal_conditions(rows)}
    assert (conditions["feasible"].holds, conditions["feasible"].measured) == (
        False,
        "3 of 4 scenarios (goal: 90%)",
    )
    assert (conditions["equal compute"].holds, conditions["equal compute"].measured) == (
        False,
        "3 of 4 scenarios (goal: 90%)",
    )
    assert (conditions["rule of thumb"].holds, conditions["rule of thumb"].measured) == (
        True,
        "3 of 4 scenarios (goal: 75%)",
    )
    # Differences to the oracle -0.01, -0.10, -0.01, -0.01: median -0.01.
    assert conditions["oracle"].holds and conditions["oracle"].measured.startswith(
        "median -0.0100 over 4 scenarios"
    )
    # Where nothing binds: -0.002 and -0.01, median -0.006, more than 0.3 points below.
    assert (
        conditions["targets alone"].holds is False
        and "median -0.0060 over 2" in conditions["targets alone"].measured
    )
    # Violations 0.05 and 0.03 (median 0.04) against 0.04 and 0.03 (median 0.035):
    # 0.04 <= 1.2 x 0.035.
    assert conditions["nothing feasible"].holds is True
    assert conditions["nothing feasible"].measured.startswith(
        "median 0.0400 against 0.0350 over 2 scenarios"
    )
    # Costs 1.5, 1.9, 2.5, 1.8, 1.0, 1.0: median 1.65; as measured, twice those.
    assert conditions["cost"].holds and conditions["cost"].measured == (
        "median 1.65x, largest 2.50x at the paper's shape (goal: median at most 2.0x); "
        "as measured, median 3.30x, largest 5.00x"
    )
    nothing = {c.name: c.holds for c in families.goal_conditions([row(0.3, cost=2.1)])}
    assert (
        nothing["nothing feasible"] is None
        and nothing["targets alone"] is None
        and nothing["cost"] is False
    )


def test_the_report_lists_every_scenario_that_ran_and_the_goal_per_split():
    done = {
        **sweep(w0_05=result(True, 0.30, 0.30)),
        "robust": result(True, 0.32, cost=1.5),
        "paper": result(True, 0.2),
    }
    evaluation = replace_seed(TWO_TARGETS, 120)
    scenarios = [
        (TWO_TARGETS, {"seed": 0}, done),
        (evaluation, {"seed": 120, "frozen_commit": "abc1234"}, done),
        (
            replace_seed(TWO_TARGETS, 121),
            {"seed": 121, "frozen_commit": "abc1234"},
            {"robust": result(True, 0.1)},
        ),
    ]
    report = families.family_report(scenarios)
    assert report["rule_of_thumb_mass"] == 0.05 and report["frozen_commits"] == ["abc1234"]
    assert list(report["scenarios"]) == ["s000", "s120", "s121"]
    assert "row" not in report["scenarios"]["s121"]
    assert sorted(report["goal"]) == ["development", "evaluation"]
    table = families.markdown(report)
    assert (
        "| s121 | evaluation | strings, dates | prose | code-heldout; none | 0.0001 | 128 "
        "| 1 of 12 | 10.0% | incomplete |" in table
    )
    assert (
        "| s120 | evaluation | strings, dates | prose | code-heldout; none | 0.0001 | 128 "
        "| 12 of 12 | 32.0% | yes | 20.0% |" in table
    )
    assert table.count("| s0") == 1 and table.count("| s12") == 2
    assert "The goal on the evaluation split:" in table
    # Evaluation scenarios of two frozen defaults are not one evaluation.
    later = (replace_seed(TWO_TARGETS, 122), {"seed": 122, "frozen_commit": "def5678"}, done)
    with pytest.raises(families.JoinError, match="frozen commits abc1234, def5678"):
        families.family_report([*scenarios, later])


def test_a_report_kept_from_earlier_runs_joins_the_scenarios_under_out(tmp_path):
    done = {
        **sweep(w0_05=result(True, 0.30, 0.30)),
        "robust": result(True, 0.32, cost=1.5),
        "paper": result(True, 0.2),
    }
    earlier = families.family_report(
        [
            (TWO_TARGETS, {"seed": 0}, done),
            (replace_seed(TWO_TARGETS, 1), {"seed": 1}, {"robust": result(True, 0.1)}),
        ]
    )
    kept = tmp_path / "families_dev.json"
    kept.write_text(json.dumps(earlier))
    # Seed 1 ran again under --out, complete this time; seed 2 ran only there.
    ran = [
        (replace_seed(TWO_TARGETS, 1), {"seed": 1}, done),
        (replace_seed(TWO_TARGETS, 2), {"seed": 2}, {"paper": result(True, 0.2)}),
    ]
    joined = families.join_scenarios(ran, [kept])
    assert [(s.seed, sorted(runs) == sorted(done)) for s, _, runs in joined] == [
        (0, True),
        (1, True),
        (2, False),
    ]
    assert families.family_report(joined)["scenarios"]["s000"] == earlier["scenarios"]["s000"]
    [*_, (seed, _, runs)] = families.join_scenarios([], [kept])
    assert seed == replace_seed(TWO_TARGETS, 1)
    assert runs == earlier["scenarios"]["s001"]["runs"]


def test_a_default_run_again_replaces_only_its_own_run_of_a_kept_report(tmp_path):
    done = {**sweep(w0_05=result(True, 0.30, 0.30)), "robust": result(True, 0.32, cost=1.5)}
    kept = tmp_path / "families_dev.json"
    kept.write_text(json.dumps(families.family_report([(TWO_TARGETS, {"seed": 0}, done)])))
    again = {"robust": result(False, 0.0, cost=1.7)}
    [(_, _, runs)] = families.join_scenarios([(TWO_TARGETS, {"seed": 0}, again)], [kept])
    assert runs["robust"]["feasible"] is False and runs["robust"]["predicted_cost"] == 1.7
    assert {k: v for k, v in runs.items() if k != "robust"} == {
        k: v for k, v in done.items() if k != "robust"
    }
    other = replace(TWO_TARGETS, steps=256)
    with pytest.raises(ValueError, match="another scenario"):
        families.join_scenarios([(other, {"seed": 0}, again)], [kept])
    with pytest.raises(ValueError, match="its runs would mix two defaults"):
        families.join_scenarios([(TWO_TARGETS, {"frozen_commit": "abc1234"}, again)], [kept])


@pytest.mark.slow
def test_results_are_read_from_run_folders(tmp_path, quick_base, single_thread, monkeypatch):
    """Two 8-step runs of a hand-made scenario on the seconds-long base model: what the
    report reads from their folders is what their records say."""
    from dynamics.experiments.demo import train_run
    from dynamics.runs import rundir

    scenario = FamilyScenario(
        seed=3, targets=("strings",), budgets=(8,), non_targets=("prose",),
        loss_constraints=("code-heldout",), accuracy_constraints=(), lr=1e-4, steps=8,
    )  # fmt: skip
    out = tmp_path / "families"
    families.prepare_data(quick_base, out / "data")
    families.record_scenario(out / scenario.name, scenario, None)
    for label in ("robust", "fixed-w1"):
        config = families.scenario_config(
            scenario,
            quick_base,
            out / "data",
            out / scenario.name / label,
            families.plan(scenario)[label],
        )
        config["evaluation"] = {"interval": 4, "batches": 2, "reduced_batches": 1}
        train_run(config)
    [(read, record, results)] = families.read_scenarios(out)
    assert read == scenario and record["split"] == "development"
    assert sorted(results) == ["fixed-w1", "robust"]
    for label, got in results.items():
        records = rundir.read_run(out / scenario.name / label)
        assert got["predicted_cost"] == records.summary["predicted_cost"]
        assert got["reduction_test"] == families.records_result(records)["reduction_test"]
    assert results["fixed-w1"]["predicted_cost"] == pytest.approx(1.0)
    assert results["robust"]["predicted_cost"] > 1.0
    # What the cost at the paper's shape assumes of the default: it probes the scenario's
    # two datasets, evaluates its two domains, trains no step again and evaluates when a
    # fixed run does.
    robust, fixed = (
        rundir.read_run(out / scenario.name / label) for label in ("robust", "fixed-w1")
    )
    assert (len(robust.summary["dataset_names"]), len(robust.summary["domain_names"])) == (2, 2)
    assert robust.summary["backtracks"] == []
    assert [p.step for p in robust.eval_points()] == [p.step for p in fixed.eval_points()]
    # --selection-margin chooses the default's checkpoint again, and only the default's.
    margins = []
    replay = families.records_result
    monkeypatch.setattr(
        families, "records_result", lambda r, m=None: margins.append(m) or replay(r, m)
    )
    [(_, _, again)] = families.read_scenarios(out, default_margin=2.0)
    assert margins == [None, 2.0]  # fixed-w1, then robust
    replayed = families.family_report([(read, record, again)], default_margin=2.0)
    assert replayed["default_selection_margin"] == 2.0
    assert "the default's again at a selection margin of 2." in families.markdown(replayed)
    assert again["robust"] == {
        **replay(robust, 2.0),
        "predicted_cost": robust.summary["predicted_cost"],
    }
    report = families.family_report([(read, record, results)])
    assert "row" not in report["scenarios"]["s003"]  # the sweep's other masses did not run
    assert (
        "| s003 | development | strings | prose | code-heldout; none | 0.0001 | 8 | 2 of 12 |"
        in families.markdown(report)
    )
