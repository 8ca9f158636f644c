"""The run report's account of target data: how much of the run trained on it, the stretch
at the end without any, the updates where no mixture was predicted feasible, and the hint
toward ``target_floor`` only where it can help."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynamics.core.records import UpdateRecord
from dynamics.core.rules import ChoiceRecord, RulesRecord
from dynamics.core.rules.target_floor import FloorDecision, TargetFloorRecord
from dynamics.report.text import run_report, target_data_lines
from dynamics.runs.rundir import RunRecords
from tests.report.lines import update

TOTAL_STEPS = 64
# Datasets math, code, prose, chat; math and chat are also target domains.
DATASETS = ["math", "code", "prose", "chat"]


def _update(
    step: int, horizon: int, weights: list[float], feasible: bool = True, **fields
) -> UpdateRecord:
    return update(step, weights, horizon, solver={"feasible": feasible}, **fields)


def _base_updates() -> list[UpdateRecord]:
    """Math and chat half each for 8 steps; then a quarter on math for the 8 steps until the
    next update (its horizon, 16, runs past it); no target data from step 16 on, where no
    mixture was predicted feasible; the last horizon (64) runs past the end."""
    return [
        _update(0, 8, [0.5, 0.0, 0.0, 0.5]),
        _update(8, 16, [0.25, 0.5, 0.25, 0.0]),
        _update(16, 16, [0.0, 0.5, 0.5, 0.0], feasible=False),
        _update(32, 64, [0.0, 1.0, 0.0, 0.0]),
    ]


def _records(
    updates: list[UpdateRecord], *, kept: bool = True, constraints: tuple[int, ...] = (2,)
) -> RunRecords:
    summary = {
        "method": "dynamics",
        "dataset_names": DATASETS,
        "domain_names": ["math", "chat", "code-heldout"],
        "targets": [0, 1],
        "constraints": list(constraints),
        "total_steps": TOTAL_STEPS,
        "best_checkpoint": {"step": 8, "eval": {}, "test": {}, "path": "best_checkpoint"}
        if kept
        else None,
    }
    return RunRecords(path=Path("run"), summary=summary, evaluations=[], updates=updates)


def test_each_update_counts_until_the_next_one_and_the_run_ends():
    lines = target_data_lines(_records(_base_updates()))
    # math 4 + 2 steps, chat 4, of 64.
    assert lines[0] == (
        "target data: 15.6% of the 64 steps (math 9.4%, chat 6.2%); "
        "none from step 16 to the end (48 steps)"
    )
    assert lines[1].startswith(
        "no mixture was predicted to keep every constraint at 1 of 4 updates (steps 16):"
    )
    assert lines[2].startswith("hint: ") and "method.floors.targets: 0.02" in lines[2]
    assert len(lines) == 3
    # Target data in the last update counts to the run's end (32 steps), not its horizon.
    updates = _base_updates()
    updates[-1].weights = np.array([0.25, 0.75, 0.0, 0.0])
    lines = target_data_lines(_records(updates))
    assert lines[0] == "target data: 28.1% of the 64 steps (math 21.9%, chat 6.2%)"
    assert not any(line.startswith("hint") for line in lines)


def test_under_token_sampling_the_steps_are_counted_by_batch_shares():
    updates = _base_updates()
    # The first update's token shares are 0.2 math and 0.8 chat; it drew half its steps from each.
    updates[0].weights = np.array([0.2, 0.0, 0.0, 0.8])
    updates[0].batch_shares = np.array([0.5, 0.0, 0.0, 0.5])
    assert target_data_lines(_records(updates)) == target_data_lines(_records(_base_updates()))


def test_updates_a_backtrack_abandoned_are_left_out():
    updates = _base_updates()
    updates.insert(3, _update(24, 8, [1.0, 0.0, 0.0, 0.0], feasible=False, abandoned=True))
    assert target_data_lines(_records(updates)) == target_data_lines(_records(_base_updates()))


def test_the_robust_verdict_decides_and_a_floor_already_set_gets_no_hint():
    updates = _base_updates()
    for record in updates:
        # The robust variant's own verdict, the opposite of the nominal solver's.
        assert record.solver is not None
        record.rules = rules_record(record, floor=0.0)
        record.solver["feasible"] = not record.solver["feasible"]
    lines = target_data_lines(_records(updates))
    assert "at 1 of 4 updates (steps 16)" in lines[1] and lines[2].startswith("hint: ")
    for record in updates:
        assert record.solver is not None
        record.rules = rules_record(record, floor=0.02, feasible=not record.solver["feasible"])
    assert target_data_lines(_records(updates)) == lines[:2]


def rules_record(update: UpdateRecord, floor: float, feasible: bool | None = None) -> RulesRecord:
    """The rules' record an update of the robust variant stores (the floor's rule only where
    it is on), kept feasible as ``update``'s solver says unless ``feasible`` is given."""
    rules = () if floor == 0.0 else (TargetFloorRecord(floor, FloorDecision(floor, [0], [])),)
    choice = ChoiceRecord(
        weights=list(update.weights),
        source="grid",
        feasible=update.solver["feasible"] if feasible is None else feasible,
        max_violation=0.0,
        objective=0.0,
    )
    return RulesRecord(rules, choice)


def test_the_hint_needs_a_quarter_of_the_run_dry_and_a_checkpoint_that_kept_the_constraints():
    def dry_from(step: int) -> list[UpdateRecord]:
        first = _base_updates()[:2]
        return [
            *first,
            _update(16, 32, [0.5, 0.5, 0.0, 0.0], feasible=False),
            _update(step, 64, [0.0, 1.0, 0.0, 0.0]),
        ]

    assert target_data_lines(_records(dry_from(48)))[-1].startswith("hint: ")  # 16 of 64 steps
    assert not target_data_lines(_records(dry_from(52)))[-1].startswith("hint")  # 12 of 64
    # Where no checkpoint kept every constraint, more target data breaks them more.
    lines = target_data_lines(_records(_base_updates(), kept=False))
    assert len(lines) == 2 and not any(line.startswith("hint") for line in lines)


def test_without_constraints_only_the_share_is_reported():
    lines = target_data_lines(_records(_base_updates(), constraints=()))
    assert lines == [target_data_lines(_records(_base_updates()))[0]]


def test_a_fixed_mixture_and_a_run_without_target_data_get_no_account():
    fixed = [update(0, [0.1, 0.45, 0.45, 0.0], TOTAL_STEPS, policy="fixed")]
    assert target_data_lines(_records(fixed)) == []
    records = _records(_base_updates())
    records.summary["dataset_names"] = [
        "algebra",
        "code",
        "prose",
        "dialogue",
    ]  # none named like a target
    assert target_data_lines(records) == []


def test_the_report_of_a_finished_run_carries_the_account():
    records = _records(_base_updates())
    records.summary.update(
        num_updates=4,
        train_seconds=1.0,
        predicted_cost=2.0,
        cost_assumption="",
        domain_metrics=["loss", "loss", "loss"],
        constrained_ppl_reduction=0.1,
    )
    assert "\n".join(target_data_lines(records)) in run_report(records)
