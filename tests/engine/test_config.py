"""Run config: validation names the field and the fix; overrides; docs stay in sync."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from dynamics.core.rules import DEFAULT_VARIANT, RULES, SELECTION_MARGINS, RuleSet
from dynamics.engine.config import ConfigError, EvaluationConfig, RunConfig
from dynamics.engine.config_docs import config_reference_markdown
from robustness import METHODS

ROOT = Path(__file__).resolve().parents[2]


def minimal(**extra) -> dict:
    data = {
        "model": {"name_or_path": "Qwen/Qwen2.5-3B"},
        "datasets": [
            {
                "name": "math",
                "path": "math.jsonl",
                "role": "target",
                "format": "instruction",
                "budget": 2000,
            },
            {
                "name": "wiki",
                "hub_id": "wikimedia/wikipedia",
                "config_name": "20231101.en",
                "role": "non-target",
            },
            {"name": "safety", "path": "safety.jsonl", "role": "constraint"},
        ],
    }
    data.update(extra)
    return data


def test_defaults_follow_the_paper():
    config = RunConfig.from_dict(minimal())
    assert config.model.trust_remote_code is False
    assert config.lora is not None and config.lora.rank == 32
    assert config.optimizer.lr_schedule == "constant" and config.optimizer.warmup_steps == 0
    assert (
        config.training.total_steps,
        config.training.batch_size,
        config.training.sequence_length,
    ) == (2048, 8, 512)
    assert (
        config.evaluation.interval,
        config.evaluation.batches,
        config.evaluation.reduced_batches,
    ) == (64, 200, 50)
    assert config.method.schedule == "dense-warmup" and config.method.predictor == "linear"
    assert [d.name for d in config.training_datasets] == ["math", "wiki"]
    assert [d.name for d in config.evaluation_domains] == ["math", "safety"]
    # Constraint domains are evaluation-only: their rows split between eval and test.
    source = config.datasets[2].data_source()
    assert (source.eval_size, source.test_size) == (0.5, 0.5)


def test_overrides_by_dotted_path_and_dataset_name():
    config = RunConfig.from_dict(
        minimal(),
        [
            "training.total_steps=256",
            "datasets.math.budget=500",
            "lora=null",
            "method.schedule=fixed:64",
        ],
    )
    assert config.training.total_steps == 256
    assert config.datasets[0].budget == 500
    assert config.lora is None
    assert config.method.schedule == "fixed:64"


@pytest.mark.parametrize(
    ("change", "fields"),
    [
        ({"training": {"total_steps": 0}}, ["training.total_steps"]),
        ({"evaluation": {"batches": 10, "reduced_batches": 20}}, ["reduced_batches"]),
        ({"method": {"schedule": "dense"}}, ["method.schedule", "dense-warmup"]),
        ({"method": {"name": "fixed"}}, ["method.weights"]),
        ({"method": {"name": "fixed", "weights": {"math": 1}}}, ["missing ['wiki']"]),
        ({"optimiser": {}}, ["optimiser", "unknown field"]),
        (
            {"model": {"name_or_path": "x", "init_config": {"model_type": "llama"}}},
            ["set only one"],
        ),
        (
            {"method": {"name": "fixed", "weights": {"math": 1, "wiki": 1}, "backtrack": 2}},
            ["method.backtrack"],
        ),
        (
            {"method": {"name": "gradient-alignment", "lp_candidate": True}},
            ["method.name: dynamics"],
        ),
        ({"method": {"backtrack": -1}}, ["method.backtrack"]),
        (
            {"method": {"backtrack_patience": 2}},
            ["method.backtrack_patience", "method.backtrack > 0"],
        ),
        ({"method": {"backtrack": 1, "backtrack_patience": 0}}, ["backtrack_patience"]),
        (  # the default variant's selection margin needs a standard error over batches
            {"evaluation": {"batches": 1, "reduced_batches": 1}},
            ["evaluation.selection_margin 1.8", "evaluation.batches to 2", "selection_margin: 0"],
        ),
    ],
)
def test_errors_name_the_field(change, fields):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(minimal(**change))
    for text in fields:
        assert text in str(info.value)


def test_dataset_errors():
    bad_role = minimal()
    bad_role["datasets"] = [{"name": "wiki", "path": "w.jsonl", "role": "non-target"}]
    with pytest.raises(ConfigError, match="role 'target'"):
        RunConfig.from_dict(bad_role)
    mc_target = minimal()
    mc_target["datasets"][0] = {
        "name": "mmlu",
        "path": "m.jsonl",
        "role": "target",
        "format": "multiple_choice",
    }
    with pytest.raises(ConfigError, match=r"only be a\s+constraint"):
        RunConfig.from_dict(mc_target)
    dupes = minimal()
    dupes["datasets"].append(dict(dupes["datasets"][0]))
    with pytest.raises(ConfigError, match="unique"):
        RunConfig.from_dict(dupes)
    evaluated_non_target = minimal()
    evaluated_non_target["datasets"].append(
        {"name": "wiki", "path": "w.jsonl", "role": "non-target", "eval_batch_size": 32}
    )
    with pytest.raises(ConfigError, match="not evaluated; remove its eval_batch_size"):
        RunConfig.from_dict(evaluated_non_target)


def test_yaml_is_safe_loaded(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("model: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        RunConfig.from_yaml(path)
    with pytest.raises(ConfigError, match="does not exist"):
        RunConfig.from_yaml(tmp_path / "missing.yaml")


def test_yaml_round_trip():
    config = RunConfig.from_dict(minimal())
    import yaml

    assert RunConfig.model_validate(yaml.safe_load(config.to_yaml())) == config


def test_config_docs_are_in_sync():
    assert (ROOT / "docs" / "config.md").read_text() == config_reference_markdown(), (
        "docs/config.md is stale: regenerate it with "
        "python -c 'from dynamics.engine.config_docs import config_reference_markdown as m; "
        'open("docs/config.md", "w").write(m())\''
    )


def test_multiple_choice_constraint_on_loss_reaches_the_data_source():
    config = minimal()
    config["datasets"].append(
        {"name": "mmlu", "path": "m.jsonl", "role": "constraint", "format": "multiple_choice"}
    )
    source = RunConfig.from_dict(config).datasets[-1].data_source()
    assert (source.format, source.metric) == ("multiple_choice", "loss")
    # Other formats are scored by loss, and their source says so.
    text = RunConfig.from_dict(config).datasets[0].data_source()
    assert (text.format, text.metric) == ("instruction", "loss")
    accuracy = RunConfig.from_dict(
        {
            **config,
            "datasets": [
                *config["datasets"][:-1],
                {**config["datasets"][-1], "metric": "accuracy"},
            ],
        }
    )
    assert accuracy.datasets[-1].data_source().metric == "accuracy"


def test_revision_and_data_files_reach_the_data_source():
    config = minimal()
    config["datasets"][1] = {
        **config["datasets"][1],
        "revision": "b8bc12bbc5758d81a5fb8981bd04148236527e38",
        "data_files": {"train": ["20231101.en/train-00000-of-00041.parquet"]},
        "stream_rows": 100,
        "stream_seed": 3,
        "stream_shuffle_buffer": 50,
    }
    source = RunConfig.from_dict(config).datasets[1].data_source()
    assert source.revision == "b8bc12bbc5758d81a5fb8981bd04148236527e38"
    assert source.data_files == {"train": ["20231101.en/train-00000-of-00041.parquet"]}
    assert (source.stream_seed, source.stream_shuffle_buffer) == (3, 50)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"path": "math.jsonl", "revision": "main"},
            r"revision 'main' pins a hub dataset's version; set hub_id",
        ),
        ({"hub_id": "org/x", "revision": ""}, r"datasets\.0\.revision"),
        (
            {"path": "math.jsonl", "data_files": "a.jsonl"},
            r"data_files='a.jsonl' chooses files of a hub dataset",
        ),
        ({"hub_id": "org/x", "data_files": []}, r"data_files=\[\]: give a file path or glob"),
        (
            {"hub_id": "org/x", "data_files": {"train": 3}},
            r"datasets\.0\.data_files: .*data_files=\{'train': 3\}: give a file",
        ),
        ({"hub_id": "org/x", "stream_shuffle_buffer": -1}, r"datasets\.0\.stream_shuffle_buffer"),
        ({"hub_id": "org/x", "loss_on": "every-turn"}, r"datasets\.0\.loss_on"),
    ],
)
def test_dataset_file_options_are_checked(change, message):
    config = minimal()
    entry = {
        key: value for key, value in config["datasets"][0].items() if key not in ("path", "hub_id")
    }
    config["datasets"][0] = {**entry, **change}
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_dict(config)


def test_single_rule_parameters_override_the_variant():
    config = minimal()
    config["method"] = {
        "name": "dynamics",
        "variant": "robust",
        "target_noise": 2.0,
        "answer_tolerance": 0.0,
        "floors": {"targets": 0.05},
    }
    rules = RunConfig.from_dict(config).method.rules()
    assert (rules.value("target_noise"), rules.value("target_floor")) == (2.0, 0.05)
    assert "answer_tolerance" not in rules.names  # 0: the rule is off
    robust = RuleSet.of_variant("robust")
    assert rules.value("gain_exponent") == robust.value("gain_exponent")  # from the variant
    config["method"] = {"name": "dynamics", "variant": "paper"}
    assert RunConfig.from_dict(config).method.rules().is_paper


def test_every_setting_the_protocol_measures_is_a_valid_method_config():
    """The benchmark's labelled settings are parsed as a user's config would be, and every
    parameter they name reaches the run's rules (a misspelt one would be refused here rather
    than an hour into the protocol)."""
    rule_parameters = {f.name for rule in RULES.values() for f in fields(rule.params_type)}
    for label, settings in METHODS.items():
        config = minimal()
        config["method"] = {"name": "dynamics", "schedule": "dense-warmup", **settings}
        method = RunConfig.from_dict(config).method
        rules = method.rules()
        for key, value in settings.items():
            if key == "floors":
                assert method.floors.all == value.get("all", 0.0), label
                assert rules.value("target_floor") == value["targets"], label
            elif key in rule_parameters:
                assert rules.value(key) == value, (label, key)
            else:
                assert getattr(method, key) == value, (label, key)


def test_a_rule_whose_requirement_is_off_is_refused_naming_both_fields():
    # The default's answer tolerance acts through expected accuracies: turning them off
    # alone is refused, and nothing a user wrote is changed to make it fit.
    config = minimal()
    config["method"] = {"name": "dynamics", "expected_accuracy": False}
    with pytest.raises(
        ConfigError,
        match=r"method\.answer_tolerance: 0\.5 acts through method\.expected_accuracy, which "
        r"is off: set method\.expected_accuracy: true \(variant: robust has it\), or "
        r"method\.answer_tolerance: 0\.0",
    ):
        RunConfig.from_dict(config)
    config["method"] = {"name": "dynamics", "expected_accuracy": False, "answer_tolerance": 0}
    rules = RunConfig.from_dict(config).method.rules()
    assert "expected_accuracy" not in rules.names and "answer_tolerance" not in rules.names
    assert rules.value("target_floor") == 0.02


def test_the_direct_candidate_is_never_turned_on_for_a_rule_that_needs_it():
    config = minimal()
    for parameter, value in (("target_noise", 1.0), ("gain_exponent", 0.5)):
        config["method"] = {"name": "dynamics", "variant": "paper", parameter: value}
        with pytest.raises(ConfigError, match=rf"method\.{parameter}: {value} acts through "):
            RunConfig.from_dict(config)
        config["method"]["lp_candidate"] = True
        assert RunConfig.from_dict(config).method.rules().names == ("lp_candidate", parameter)
    config["method"] = {"name": "dynamics", "lp_candidate": False, "target_noise": 1.0}
    with pytest.raises(ConfigError, match=r"method\.lp_candidate, which is off"):
        RunConfig.from_dict(config)


def test_the_floors_are_one_setting_and_the_keys_of_each_floor_alone_are_refused():
    config = minimal()
    config["method"] = {"name": "dynamics", "floors": {"all": 0.1, "targets": 0.2}}
    method = RunConfig.from_dict(config).method
    assert (method.floors.all, method.target_floor) == (0.1, 0.2)
    for key, written in (("min_weight", "floors: {all: 0.1}"), ("target_floor", "targets: 0.1")):
        config["method"] = {"name": "dynamics", key: 0.1}
        with pytest.raises(ConfigError, match=rf"method\.{key} is set in method\.floors: "):
            RunConfig.from_dict(config)
        with pytest.raises(ConfigError, match=re.escape(written)):
            RunConfig.from_dict(config)


def test_dynamics_runs_the_default_variant_and_the_saved_config_names_it():
    config = minimal()
    config["method"] = {"name": "dynamics"}
    parsed = RunConfig.from_dict(config)
    assert parsed.method.variant == DEFAULT_VARIANT == "robust"
    assert parsed.method.rules() == RuleSet.of_variant("robust")
    assert yaml.safe_load(parsed.to_yaml())["method"]["variant"] == "robust"
    assert (
        RunConfig.from_dict(yaml.safe_load(parsed.to_yaml())) == parsed
    )  # what a resume reads back


@pytest.mark.parametrize(
    ("method", "margin"),
    [
        ({"name": "dynamics"}, SELECTION_MARGINS["robust"]),
        ({"name": "dynamics", "variant": "robust"}, 1.8),
        ({"name": "dynamics", "variant": "paper"}, 0.0),
        ({"name": "fixed", "weights": {"math": 1.0, "wiki": 1.0}}, 0.0),
    ],
)
def test_an_unset_selection_margin_is_the_variants_and_the_saved_config_says_it(method, margin):
    config = minimal()
    config["method"] = method
    parsed = RunConfig.from_dict(config)
    assert parsed.evaluation.selection_margin == margin
    saved = yaml.safe_load(parsed.to_yaml())
    assert saved["evaluation"]["selection_margin"] == margin
    assert RunConfig.from_dict(saved) == parsed  # what a resume reads back
    # A margin the config sets is kept, from YAML and from a section built in Python.
    config["evaluation"] = {"selection_margin": 0.5}
    assert RunConfig.from_dict(config).evaluation.selection_margin == 0.5
    built = RunConfig(**{**config, "evaluation": EvaluationConfig()})
    assert built.evaluation.selection_margin == margin
    kept = RunConfig(**{**config, "evaluation": EvaluationConfig(selection_margin=0.5)})
    assert kept.evaluation.selection_margin == 0.5


def test_methods_without_probes_have_no_variant():
    config = minimal()
    config["method"] = {"name": "fixed", "weights": {"math": 1.0, "wiki": 1.0}}
    parsed = RunConfig.from_dict(config)
    assert parsed.method.variant is None and parsed.method.rules().is_paper
    assert RunConfig.from_dict(yaml.safe_load(parsed.to_yaml())) == parsed
    # A saved config may say variant: paper for a fixed run; it reads as no variant, so the
    # run it belongs to resumes with the same config.
    config["method"]["variant"] = "paper"
    assert RunConfig.from_dict(config) == parsed
    config["method"]["variant"] = "robust"
    with pytest.raises(ConfigError, match=r"only method\.name: dynamics uses them"):
        RunConfig.from_dict(config)


def test_an_unknown_method_name_is_refused_with_the_registered_policies():
    config = minimal()
    config["method"] = {"name": "greedy"}
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "unknown method.name 'greedy': use one of ['dynamics', 'fixed', 'gradient-alignment']"
        ),
    ):
        RunConfig.from_dict(config)
