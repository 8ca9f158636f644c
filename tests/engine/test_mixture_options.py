"""``method.min_weight`` and ``training.sampling`` in the run config and the parts built from it."""

from __future__ import annotations

import pytest

from dynamics.core.policies import DynamicsPolicy, GradientAlignmentPolicy
from dynamics.engine.components import build_policy
from dynamics.engine.config import ConfigError, RunConfig
from tests.engine.test_config import minimal


def test_defaults_leave_the_paper_alone():
    config = RunConfig.from_dict(minimal())
    assert config.method.min_weight == 0.0
    assert config.training.sampling == "batches"


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("method.min_weight=-0.1", ["method.min_weight", "greater than or equal to 0"]),
        # two training datasets (math, wiki): at most 0.5 each
        ("method.min_weight=0.6", ["method.min_weight (0.6)", "2 training datasets", "at most 0.5"]),
        ("training.sampling=rows", ["training.sampling", "'batches' or 'tokens'"]),
    ],
)
def test_bad_values_name_the_field(override: str, words: list[str]):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(minimal(), [override])
    for word in words:
        assert word in str(err.value)


def test_a_target_floor_that_leaves_the_others_nothing_is_refused():
    assert RunConfig.from_dict(minimal(), ["method.target_floor=0.5"]).method.target_floor == 0.5
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(minimal(), ["method.target_floor=1.0"])
    assert "method.target_floor" in str(err.value)
    with pytest.raises(ConfigError) as err:  # 0.6 on the target, 0.4 held on the other dataset
        RunConfig.from_dict(minimal(), ["method.min_weight=0.4", "method.target_floor=0.6"])
    assert "method.target_floor (0.6) for each of the 1 target datasets" in str(err.value)
    assert "lower it below 0.6" in str(err.value)


def test_half_each_for_two_datasets_is_allowed():
    assert RunConfig.from_dict(minimal(), ["method.min_weight=0.5"]).method.min_weight == 0.5


def test_fixed_weights_are_checked_against_the_floor():
    fixed = {"name": "fixed", "weights": {"math": 3, "wiki": 1}}  # 0.75 and 0.25 once normalised
    assert RunConfig.from_dict(minimal(method={**fixed, "min_weight": 0.25})).method.min_weight == 0.25
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(minimal(method={**fixed, "min_weight": 0.3}))
    assert "method.weights give ['wiki'] less than method.min_weight (0.3)" in str(err.value)


@pytest.mark.parametrize("name", ["dynamics", "gradient-alignment"])
def test_the_policy_gets_the_floor(name: str):
    config = RunConfig.from_dict(minimal(method={"name": name, "min_weight": 0.2, "alignment_batches": 10}))
    policy = build_policy(config, ["math", "wiki"])
    assert isinstance(policy, DynamicsPolicy | GradientAlignmentPolicy)
    assert policy.min_weight == 0.2
