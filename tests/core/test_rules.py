"""The decision rules as a registered pipeline (``dynamics.core.rules``): the registry and
its variants, the requirements a rule declares, the typed record an update stores as
``extra.robust``, and the policies chosen by name."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from dynamics.core.controller import run_mixture_training
from dynamics.core.policies import DynamicsPolicy, FixedWeightsPolicy, GradientAlignmentPolicy
from dynamics.core.policy_registry import POLICIES, PolicySettings
from dynamics.core.records import UpdateRecord
from dynamics.core.rules import RULES, VARIANTS, RuleSet, RulesRecord, register, rule_set
from dynamics.core.rules.answer_tolerance import AnswerTolerance
from dynamics.core.rules.lp_candidate import LpCandidateRecord
from dynamics.core.rules.target_floor import TargetFloorRecord
from dynamics.core.schedules import build_schedule
from tests.core.toy_learner import ToyLearner

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
SLOPES = np.array([[-0.010, -0.001, 0.000], [0.004, -0.001, 0.000], [0.001, -0.0005, 0.0]])
INITIAL = np.array([3.0, 2.0, 2.5])


def toy_updates(rules: RuleSet) -> list[UpdateRecord]:
    policy = DynamicsPolicy(build_schedule([0, 8, 32, 64], 96, probe_cap=8), rules=rules)
    return run_mixture_training(
        ToyLearner(SLOPES, INITIAL),
        policy,
        targets=[0],
        constraints=[1, 2],
        eval_interval=32,
        reduced_batches=4,
    ).updates


def test_the_robust_variant_is_the_six_rules_with_their_values_and_paper_is_none():
    robust = RuleSet.of_variant("robust")
    assert robust.names == (
        "lp_candidate",
        "target_noise",
        "gain_exponent",
        "target_floor",
        "expected_accuracy",
        "answer_tolerance",
    )
    values = {name: robust.value(name) for name in robust.names}
    assert values == {
        "lp_candidate": True,
        "target_noise": 1.0,
        "gain_exponent": 0.5,
        "target_floor": 0.02,
        "expected_accuracy": True,
        "answer_tolerance": 0.5,
    }
    assert RuleSet.of_variant("paper").is_paper and VARIANTS["paper"] == ()
    with pytest.raises(ValueError, match=r"unknown method\.variant 'fast'"):
        RuleSet.of_variant("fast")


def test_a_rule_given_its_off_values_is_off_and_every_rule_is_one_parameter_set():
    assert rule_set(target_noise=0.0, answer_tolerance=0.0).is_paper
    assert RuleSet.of_variant("robust").replaced(answer_tolerance=0.0).names == (
        "lp_candidate",
        "target_noise",
        "gain_exponent",
        "target_floor",
        "expected_accuracy",
    )
    for name, rule in RULES.items():
        assert name in {f.name for f in fields(rule.params_type)}  # the record's key
    with pytest.raises(ValueError, match="no registered decision rule has a parameter 'floor'"):
        rule_set(floor=0.1)


def test_a_rule_whose_requirement_is_off_is_refused_and_nothing_is_switched_on():
    with pytest.raises(
        ValueError,
        match=r"^method\.gain_exponent: 0\.5 acts through method\.lp_candidate, which is off: set "
        r"method\.lp_candidate: true \(variant: robust has it\), or method\.gain_exponent: 1\.0$",
    ):
        rule_set(gain_exponent=0.5)
    with pytest.raises(ValueError, match=r"method\.expected_accuracy, which is off"):
        RuleSet.of_variant("robust").replaced(expected_accuracy=False)


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="'answer_tolerance' is already registered"):
        register(AnswerTolerance)


@pytest.mark.parametrize("name", ["robust", "resumed"])
def test_the_typed_record_writes_the_golden_records_keys_and_values(name: str):
    for line in (GOLDEN / name / "controller.jsonl").read_text().splitlines():
        row = json.loads(line)
        record = UpdateRecord.from_dict({**row, "probe_seconds": 0.0})  # wall times left out
        assert isinstance(record.rules, RulesRecord)
        floors = record.rules.find(TargetFloorRecord).floors
        assert floors is not None and floors.floor == 0.02
        assert json.dumps(record.to_dict()["extra"]["robust"], sort_keys=True) == json.dumps(
            row["extra"]["robust"], sort_keys=True
        )


def test_an_update_records_the_rules_that_were_on_and_what_they_decided():
    updates = toy_updates(rule_set(lp_candidate=True, target_floor=0.1))
    for update in updates:
        row = update.to_dict()["extra"]["robust"]
        assert set(row) == {
            "lp_candidate",
            "target_floor",
            "floors",
            "weights",
            "source",
            "feasible",
            "max_violation",
            "objective",
        }
        assert RulesRecord.from_dict(row) == update.rules
        assert update.rules is not None
        assert update.rules.find(LpCandidateRecord).solver_failure is None
        floors = update.rules.find(TargetFloorRecord).floors
        assert floors is not None and floors.floor == 0.1
        np.testing.assert_allclose(update.rules.choice.weights, update.weights)


def test_each_method_name_is_one_policy_class_built_from_the_same_settings():
    assert POLICIES == {
        "dynamics": DynamicsPolicy,
        "fixed": FixedWeightsPolicy,
        "gradient-alignment": GradientAlignmentPolicy,
    }
    settings = PolicySettings(
        dataset_names=["a", "b"],
        total_steps=64,
        schedule="fixed:16",
        rules=RuleSet.of_variant("robust"),
        min_weight=0.1,
        weights={"b": 3.0, "a": 1.0},
    )
    dynamics = POLICIES["dynamics"].from_settings(settings)
    assert isinstance(dynamics, DynamicsPolicy) and dynamics.rules == settings.rules
    assert dynamics.min_weight == 0.1 and dynamics.schedule.steps[:2] == (0, 16)
    fixed = POLICIES["fixed"].from_settings(settings)
    assert isinstance(fixed, FixedWeightsPolicy)
    np.testing.assert_allclose(fixed.weights, [0.25, 0.75])
    with pytest.raises(ValueError, match=r"less than method\.floors\.all \(0\.3\)"):
        POLICIES["fixed"].from_settings(
            PolicySettings(["a", "b"], 64, weights={"a": 1.0, "b": 9.0}, min_weight=0.3)
        )
