"""The paper's scenarios as data, checked against the paper's tables
(tab:datasets, tab:scenarios, tab:accuracy_scenarios)."""

from __future__ import annotations

import json

import pytest

from dynamics import cli
from dynamics.data.scenarios import (
    DATASETS,
    TINY_BENCHMARKS,
    ConstraintSpec,
    DatasetSpec,
    ScenarioError,
    list_scenarios,
    load_scenario,
)

# (n_T, n_C) as printed in the paper's tables, typed in independently of the JSON.
TABLE_COUNTS: dict[int, tuple[int, int]] = {
    **{n: (1, 3) for n in range(1, 7)},
    **{n: (1, 5) for n in range(7, 11)},
    **{n: (2, 3) for n in range(11, 16)},
    **{n: (2, 5) for n in range(16, 23)},
    **{n: (2, 7) for n in range(23, 29)},
    **{n: (3, 3) for n in range(29, 33)},
    **{n: (3, 5) for n in range(33, 41)},
    41: (3, 6),
    **{n: (3, 7) for n in range(42, 48)},
    **{n: (3, 10) for n in range(48, 51)},
    51: (1, 1),
    52: (1, 3),
    53: (2, 3),
    54: (2, 5),
}

# Scenarios whose constraints are printed as "4×tiny, ...".
FOUR_TINY = {16, 17, 19, 20, 21, 22, *range(23, 29), 33, 34, 35, 36, 37, 39, 40, *range(41, 51)}

# Rows whose transcribed lists disagree with the table's own n_T or n_C. None does; a new
# entry here must come with a "note" in the JSON explaining it.
KNOWN_DISCREPANCIES: set[int] = set()


def test_all_54_scenarios_in_order() -> None:
    scenarios = list_scenarios()
    assert [s.number for s in scenarios] == list(range(1, 55))
    assert [s.name for s in scenarios] == [f"paper/s{n}" for n in range(1, 55)]
    assert {s.table for s in scenarios[:50]} == {"tab:scenarios"}
    assert {s.table for s in scenarios[50:]} == {"tab:accuracy_scenarios"}


@pytest.mark.parametrize("number", sorted(TABLE_COUNTS))
def test_counts_match_the_table(number: int) -> None:
    scenario = load_scenario(f"paper/s{number}")
    assert (scenario.table_n_T, scenario.table_n_C) == TABLE_COUNTS[number]
    if number not in KNOWN_DISCREPANCIES:
        assert (scenario.n_T, scenario.n_C) == TABLE_COUNTS[number]


def test_discrepancies_are_exactly_the_known_ones() -> None:
    disagreeing = {
        s.number for s in list_scenarios() if (s.n_T, s.n_C) != (s.table_n_T, s.table_n_C)
    }
    assert disagreeing == KNOWN_DISCREPANCIES
    for number in KNOWN_DISCREPANCIES:
        assert load_scenario(f"paper/s{number}").note


def test_scenario_41_is_the_only_six_constraint_row_and_says_so() -> None:
    assert [s.number for s in list_scenarios() if s.n_C == 6] == [41]
    note = load_scenario("paper/s41").note
    assert note is not None and "n_C = 6" in note


def test_every_abbreviation_is_a_known_dataset_in_its_role() -> None:
    assert len(DATASETS) == 22
    for scenario in list_scenarios():
        for spec in scenario.fine_tuning_datasets:
            # Benchmarks are never trained on (tab:datasets).
            assert DATASETS[spec.abbrev].group != "benchmark", (scenario.name, spec)
        for target in scenario.targets:
            assert DATASETS[target.abbrev].group == "instruction", (scenario.name, target)
        for constraint in scenario.constraints:
            # Open-domain corpora are only non-targets.
            assert DATASETS[constraint.abbrev].group != "open-domain corpus", (
                scenario.name,
                constraint,
            )
        # Constraints are evaluation-only: never also in the training mixture.
        trained = {d.abbrev for d in scenario.fine_tuning_datasets}
        assert not trained & {c.abbrev for c in scenario.constraints}, scenario.name
        assert len(trained) == scenario.N, f"{scenario.name} lists a dataset twice"


def test_dataset_groups() -> None:
    groups = {
        group: sorted(d.abbrev for d in DATASETS.values() if d.group == group)
        for group in ("instruction", "open-domain corpus", "benchmark")
    }
    assert groups["open-domain corpus"] == ["FW", "WP"]
    assert groups["benchmark"] == sorted(["tM", "tT", "tH", "tA", "NS", "SQ", "BQ"])
    assert len(groups["instruction"]) == 13
    assert {d.abbrev for d in DATASETS.values() if d.unlimited} == {"WP", "FW"}
    assert DATASETS["tA"].name == "tinyAI2_ARC"


def test_budgets_parsed_and_unlimited_only_for_corpora() -> None:
    for scenario in list_scenarios():
        for spec in scenario.fine_tuning_datasets:
            assert (spec.budget is None) == DATASETS[spec.abbrev].unlimited, (scenario.name, spec)
            assert spec.budget is None or spec.budget > 0
    # "2k", "1.5k", "500", "50k" as printed.
    assert load_scenario("paper/s1").targets == (DatasetSpec("MM", 2000),)
    assert load_scenario("paper/s7").targets == (DatasetSpec("OO", 1500),)
    assert load_scenario("paper/s2").targets == (DatasetSpec("CF", 500),)
    assert load_scenario("paper/s34").non_targets == (
        DatasetSpec("WP", None),
        DatasetSpec("BS", 20000),
        DatasetSpec("Ay", 50000),
    )


def test_four_tiny_is_expanded() -> None:
    assert TINY_BENCHMARKS == ("tM", "tT", "tH", "tA")
    for scenario in list_scenarios():
        first_four = tuple(c.abbrev for c in scenario.constraints[:4])
        assert (first_four == TINY_BENCHMARKS) == (scenario.number in FOUR_TINY), scenario.name


def test_full_rows() -> None:
    s28 = load_scenario("paper/s28")
    assert s28.targets == (DatasetSpec("NM", 1000), DatasetSpec("GF", 300))
    assert s28.non_targets == (DatasetSpec("WP", None), DatasetSpec("FW", None))
    assert [c.abbrev for c in s28.constraints] == "tM tT tH tA SQ BQ MS".split()
    assert (s28.n_T, s28.n_C, s28.N, s28.M) == (2, 7, 4, 9)

    s49 = load_scenario("paper/s49")
    assert [c.abbrev for c in s49.constraints] == "tM tT tH tA MS OO BS NS SQ BQ".split()
    assert s49.non_targets == (
        DatasetSpec("WP", None),
        DatasetSpec("FW", None),
        DatasetSpec("OT", 2000),
        DatasetSpec("RQ", 3000),
    )
    s20 = load_scenario("paper/s20")
    assert s20.non_targets == (
        DatasetSpec("BS", 3000),
        DatasetSpec("OT", 2000),
        DatasetSpec("GS", 5000),
    )
    assert s20.evaluation_domains == ("CF", "AI", "tM", "tT", "tH", "tA", "NS")


def test_accuracy_constraints_only_in_the_accuracy_table() -> None:
    for scenario in list_scenarios():
        accuracy = {c.abbrev for c in scenario.constraints if c.metric == "accuracy"}
        if scenario.number <= 50:
            assert accuracy == set(), scenario.name
        else:
            # tab:accuracy_scenarios: tM and tA are accuracy constraints wherever they appear.
            assert accuracy == {c.abbrev for c in scenario.constraints} & {"tM", "tA"}, (
                scenario.name
            )
    assert load_scenario("paper/s51").constraints == (ConstraintSpec("tM", "accuracy"),)
    assert load_scenario("paper/s54").constraints == (
        ConstraintSpec("tM", "accuracy"),
        ConstraintSpec("tA", "accuracy"),
        ConstraintSpec("tH", "loss"),
        ConstraintSpec("tT", "loss"),
        ConstraintSpec("NS", "loss"),
    )
    s53 = load_scenario("paper/s53")
    assert [c.metric for c in s53.constraints] == ["accuracy", "accuracy", "loss"]


@pytest.mark.parametrize("name", ["s28", "28", "paper/28", "paper/s028", "Paper/s28"])
def test_near_miss_names_suggest_the_valid_form(name: str) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(name)
    message = str(info.value)
    assert "paper/sNN" in message and "dynamics scenarios list" in message
    if name != "Paper/s28":
        assert "did you mean 'paper/s28'" in message


def test_unknown_number_has_no_suggestion() -> None:
    with pytest.raises(ScenarioError, match="unknown scenario 'paper/s55': scenarios are named"):
        load_scenario("paper/s55")


# --- CLI ------------------------------------------------------------------------------


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    # Only this command: the real entry point, without importing the other commands.
    monkeypatch.setattr(cli, "COMMANDS", {"scenarios": "dynamics.commands.scenarios"})

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(["scenarios", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_cli_list(run_cli) -> None:
    code, out, err = run_cli("list")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["name", "n_T", "n_C", "N", "targets", "constraints"]
    rows = [line for line in lines if line.startswith("paper/s")]
    assert len(rows) == 54
    assert rows[27].split()[:6] == ["paper/s28", "2", "7", "4", "NM(1k),", "GF(300)"]
    assert "tM(acc)" in rows[50]


def test_cli_list_json(run_cli) -> None:
    code, out, _ = run_cli("list", "--json")
    assert code == 0
    data = json.loads(out)
    assert len(data) == 54
    assert data[40]["name"] == "paper/s41" and data[40]["n_C"] == 6 and data[40]["note"]
    assert {(d["name"], d["N"], d["M"]) for d in data} >= {("paper/s1", 4, 4), ("paper/s50", 8, 13)}


def test_cli_show(run_cli) -> None:
    code, out, _ = run_cli("show", "paper/s54")
    assert code == 0
    assert out.startswith("paper/s54  (scenario 54 of the paper's table tab:accuracy_scenarios)")
    assert "tinyMMLU" in out and "accuracy must not get worse" in out
    assert "N = 4 fine-tuning datasets" in out and "M = 7 evaluation domains" in out


def test_cli_show_json(run_cli) -> None:
    code, out, _ = run_cli("show", "paper/s28", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["targets"] == [
        {"abbrev": "NM", "name": "NuminaMath-CoT", "budget": 1000},
        {"abbrev": "GF", "name": "GlaiveFunctionCalling", "budget": 300},
    ]
    assert data["non_targets"][0] == {"abbrev": "WP", "name": "Wikipedia", "budget": None}
    assert (data["n_T"], data["n_C"], data["N"], data["M"]) == (2, 7, 4, 9)


def test_cli_bad_name_is_a_one_line_usage_error(run_cli) -> None:
    code, out, err = run_cli("show", "s28")
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith(
        "dynamics scenarios: error: unknown scenario 's28' (did you mean 'paper/s28'?)"
    )
    assert "dynamics scenarios list" in err
