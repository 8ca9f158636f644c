"""The paper's 54 scenarios and 22 datasets as data.

The tables are transcribed in ``paper_scenarios.json`` (package data); this module reads
them into frozen dataclasses. A scenario is named ``paper/sNN``: ``paper/s1`` to
``paper/s50`` are the main scenarios (table tab:scenarios, appendix "50 Evaluation
Scenarios"; every constraint is on the loss) and ``paper/s51`` to ``paper/s54`` the
accuracy-constraint scenarios (table tab:accuracy_scenarios, appendix "Expressing
Constraints in Terms of Accuracy"; tM and tA are constrained on multiple-choice accuracy,
the other constraints on the loss). The datasets are table tab:datasets. Tables are named
by their LaTeX labels because appendix letters depend on how the paper is compiled.

Counting, in the paper's terms (section 3):

- ``N`` fine-tuning datasets = targets + non-targets: the datasets the mixture is over,
  each probed once per update.
- ``M`` evaluation domains = targets + constraints: ``T ∪ C = {1, ..., M}``. A target is
  both a fine-tuning dataset and an evaluation domain; a non-target is only trained on
  (its loss is neither minimised nor constrained); a constraint is only evaluated. This
  is also the ``M`` of the cost model; see ``dynamics.core.cost`` for why.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

DatasetGroup = Literal["instruction", "open-domain corpus", "benchmark"]
ConstraintMetric = Literal["loss", "accuracy"]

SCENARIO_PREFIX = "paper/s"
_GROUPS: tuple[str, ...] = ("instruction", "open-domain corpus", "benchmark")
_METRICS: tuple[str, ...] = ("loss", "accuracy")


class ScenarioError(KeyError):
    """An unknown scenario name; the message says how names look and how to list them."""

    def __str__(self) -> str:
        # KeyError would print the message quoted, as if it were a dictionary key.
        return str(self.args[0])


@dataclass(frozen=True)
class DatasetInfo:
    """One row of the paper's dataset table (table tab:datasets)."""

    abbrev: str
    name: str
    description: str
    group: DatasetGroup
    """``instruction`` datasets are fine-tuned on or held out as constraints; an
    ``open-domain corpus`` (WP, FW) is only a non-target with unlimited samples; a
    ``benchmark`` is only ever a constraint, never trained on."""
    unlimited: bool
    """True when the dataset is never exhausted (WP, FW): its budget is always None."""


@dataclass(frozen=True)
class DatasetSpec:
    """A fine-tuning dataset of a scenario with its sample budget."""

    abbrev: str
    budget: int | None
    """Training samples available, as printed in the table (``2k`` = 2000); None = unlimited."""


@dataclass(frozen=True)
class ConstraintSpec:
    """A constrained evaluation domain: its metric must not get worse than at step 0."""

    abbrev: str
    metric: ConstraintMetric
    """``loss``: evaluation loss at or below the base model's; ``accuracy``: multiple-choice
    accuracy (letter-restricted argmax) at or above the base model's."""


@dataclass(frozen=True)
class Scenario:
    """One scenario of the paper: what to train on, what to improve, what to preserve."""

    name: str
    number: int
    table: Literal["tab:scenarios", "tab:accuracy_scenarios"]
    """The paper table the scenario comes from (the 50 main ones, or the 4 with accuracy)."""
    targets: tuple[DatasetSpec, ...]
    non_targets: tuple[DatasetSpec, ...]
    constraints: tuple[ConstraintSpec, ...]
    table_n_T: int
    """n_T exactly as printed in the paper's table (``n_T`` counts the transcribed list)."""
    table_n_C: int
    """n_C exactly as printed in the paper's table (``n_C`` counts the transcribed list)."""
    note: str | None = None
    """A remark on the transcription (for instance a row that disagrees with itself)."""

    @property
    def n_T(self) -> int:
        """Number of target domains."""
        return len(self.targets)

    @property
    def n_C(self) -> int:
        """Number of constrained domains."""
        return len(self.constraints)

    @property
    def N(self) -> int:
        """Number of fine-tuning datasets (targets + non-targets), the mixture's size."""
        return len(self.targets) + len(self.non_targets)

    @property
    def M(self) -> int:
        """Number of evaluation domains (targets + constraints), paper section 3."""
        return len(self.targets) + len(self.constraints)

    @property
    def fine_tuning_datasets(self) -> tuple[DatasetSpec, ...]:
        """Targets first, then non-targets: the order of the mixture weights."""
        return self.targets + self.non_targets

    @property
    def evaluation_domains(self) -> tuple[str, ...]:
        """Abbreviations of the targets, then the constraints."""
        return tuple(t.abbrev for t in self.targets) + tuple(c.abbrev for c in self.constraints)


def _read_tables() -> dict[str, Any]:
    text = (
        resources.files("dynamics.data")
        .joinpath("paper_scenarios.json")
        .read_text(encoding="utf-8")
    )
    tables: dict[str, Any] = json.loads(text)
    return tables


def _parse_datasets(rows: list[dict[str, Any]]) -> dict[str, DatasetInfo]:
    datasets: dict[str, DatasetInfo] = {}
    for row in rows:
        if row["group"] not in _GROUPS:
            raise ValueError(
                f"paper_scenarios.json: dataset {row['abbrev']!r} has "
                f"unknown group {row['group']!r}"
            )
        datasets[row["abbrev"]] = DatasetInfo(
            abbrev=row["abbrev"],
            name=row["name"],
            description=row["description"],
            group=row["group"],
            unlimited=bool(row["unlimited"]),
        )
    return datasets


def _parse_scenario(row: dict[str, Any], datasets: dict[str, DatasetInfo]) -> Scenario:
    number = int(row["number"])

    def known(abbrev: str) -> str:
        # A typo in the JSON must fail at import, not as a missing loader deep in a run.
        if abbrev not in datasets:
            raise ValueError(
                f"paper_scenarios.json: scenario {number} names unknown dataset {abbrev!r}"
            )
        return abbrev

    def specs(items: list[dict[str, Any]]) -> tuple[DatasetSpec, ...]:
        return tuple(DatasetSpec(known(item["abbrev"]), item["budget"]) for item in items)

    constraints = []
    for item in row["constraints"]:
        if item["metric"] not in _METRICS:
            raise ValueError(
                f"paper_scenarios.json: scenario {number} has unknown metric {item['metric']!r}"
            )
        constraints.append(ConstraintSpec(known(item["abbrev"]), item["metric"]))
    return Scenario(
        name=f"{SCENARIO_PREFIX}{number}",
        number=number,
        table=row["table"],
        targets=specs(row["targets"]),
        non_targets=specs(row["non_targets"]),
        constraints=tuple(constraints),
        table_n_T=int(row["n_T"]),
        table_n_C=int(row["n_C"]),
        note=row.get("note"),
    )


_TABLES = _read_tables()

# Abbreviation -> dataset, in the order of the paper's dataset table.
DATASETS: dict[str, DatasetInfo] = _parse_datasets(_TABLES["datasets"])

# "4×tiny" in the scenario tables stands for these four constraints, in this order.
TINY_BENCHMARKS: tuple[str, ...] = tuple(_TABLES["conventions"]["4×tiny"])

# Scenario name ("paper/s28") -> scenario, in the paper's order.
SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (_parse_scenario(row, DATASETS) for row in _TABLES["scenarios"])
}


def list_scenarios() -> list[Scenario]:
    """All 54 scenarios in the paper's order (s1..s50, then s51..s54)."""
    return list(SCENARIOS.values())


def load_scenario(name: str) -> Scenario:
    """The scenario named ``paper/sNN`` (NN from 1 to 54, no leading zero)."""
    scenario = SCENARIOS.get(name)
    if scenario is not None:
        return scenario
    hint = ""
    # Suggest the canonical spelling for the obvious near misses: "s28", "28", "paper/28",
    # "paper/s028".
    match = re.fullmatch(r"(?:paper/)?s?0*(\d+)", name.strip())
    if match and f"{SCENARIO_PREFIX}{match.group(1)}" in SCENARIOS:
        hint = f" (did you mean '{SCENARIO_PREFIX}{match.group(1)}'?)"
    raise ScenarioError(
        f"unknown scenario {name!r}{hint}: scenarios are named 'paper/sNN' with NN from 1 to "
        f"{len(SCENARIOS)}, e.g. 'paper/s28'; run `dynamics scenarios list` to see them all"
    )
