"""``method.min_weight`` and ``training.sampling`` in the run config and the parts built from it."""

from __future__ import annotations

import numpy as np
import pytest

from dynamics.core.policies import DynamicsPolicy, FixedWeightsPolicy, GradientAlignmentPolicy
from dynamics.core.shares import TokenShares
from dynamics.engine.components import build_data, build_policy
from dynamics.engine.config import ConfigError, RunConfig
from dynamics.engine.model import load_tokenizer
from dynamics.engine.preflight import RunSetupError
from dynamics.engine.run import run
from dynamics.runs.rundir import read_run
from tests.engine.test_config import minimal
from tests.engine.test_run import tiny_config


def test_defaults_leave_the_paper_alone():
    config = RunConfig.from_dict(minimal())
    assert config.method.min_weight == 0.0
    assert config.training.sampling == "batches"


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("method.min_weight=-0.1", ["method.min_weight", "greater than or equal to 0"]),
        # two training datasets (math, wiki): at most 0.5 each
        (
            "method.min_weight=0.6",
            ["method.min_weight (0.6)", "2 training datasets", "at most 0.5"],
        ),
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
    assert (
        RunConfig.from_dict(minimal(method={**fixed, "min_weight": 0.25})).method.min_weight == 0.25
    )
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(minimal(method={**fixed, "min_weight": 0.3}))
    assert "method.weights give ['wiki'] less than method.min_weight (0.3)" in str(err.value)


def test_fixed_token_shares_are_checked_against_the_floor_as_batch_shares():
    # Token shares 0.5 and 0.5 of math (64 tokens a batch) and wiki (256): batch shares 0.8 and 0.2.
    fixed = {"name": "fixed", "weights": {"math": 1, "wiki": 1}, "min_weight": 0.3}
    config = RunConfig.from_dict(minimal(method=fixed), ["training.sampling=tokens"])
    unit = TokenShares(np.array([64.0, 256.0]))
    with pytest.raises(RunSetupError) as err:
        build_policy(config, ["math", "wiki"], unit)
    assert str(err.value) == (
        "method.weights draw {'wiki': 0.2} of the batches under training.sampling: tokens, "
        "less than method.min_weight (0.3), a share of batches: "
        "raise their weights or lower method.min_weight"
    )
    allowed = TokenShares(np.array([64.0, 96.0]))  # batch shares 0.6 and 0.4
    policy = build_policy(config, ["math", "wiki"], allowed)
    assert isinstance(policy, FixedWeightsPolicy)
    assert policy.unit is allowed


@pytest.mark.parametrize("name", ["dynamics", "gradient-alignment"])
def test_the_policy_gets_the_floor_and_the_unit(name: str):
    config = RunConfig.from_dict(
        minimal(method={"name": name, "min_weight": 0.2, "alignment_batches": 10})
    )
    unit = TokenShares(np.array([64.0, 256.0]))
    policy = build_policy(config, ["math", "wiki"], unit)
    assert isinstance(policy, DynamicsPolicy | GradientAlignmentPolicy)
    assert policy.min_weight == 0.2
    assert policy.unit is unit


def test_a_run_by_tokens_records_token_shares_and_the_batch_shares_it_trains(
    tokenizer_dir, tmp_path
):
    data = tiny_config(tokenizer_dir, tmp_path / "run")
    data["training"]["sampling"] = "tokens"
    config = RunConfig.from_dict(data)
    run(config, progress=False)
    streams = build_data(config, load_tokenizer(config.model)).streams
    unit = TokenShares(np.array([stream.mean_tokens_per_batch for stream in streams]))
    assert (
        unit.tokens_per_batch[1] > 1.05 * unit.tokens_per_batch[0]
    )  # math's rows are shorter than wiki's
    records = read_run(tmp_path / "run")
    assert len(records.updates) == 3
    for update in records.updates:
        batch_shares = np.array(update["extra"]["batch_shares"])
        assert update["weights"] == pytest.approx(unit.weights_of(batch_shares), abs=1e-12)
    in_force = {row["step"]: row["weights"] for row in records.evaluations}
    assert [in_force[0][name] for name in ("math", "wiki")] == pytest.approx(
        records.updates[0]["weights"], abs=0
    )
    assert [in_force[4][name] for name in ("math", "wiki")] == pytest.approx(
        records.updates[2]["weights"], abs=0
    )
