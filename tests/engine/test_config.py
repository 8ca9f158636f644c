"""Run config: validation names the field and the fix; overrides; docs stay in sync."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dynamics.core.options import DEFAULT_VARIANT, VARIANTS
from dynamics.engine.config import ConfigError, RunConfig
from dynamics.engine.config_docs import config_reference_markdown
from dynamics.experiments.robustness import METHODS

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
            {"method": {"name": "gradient-alignment", "calibration": True}},
            ["method.name: dynamics"],
        ),
        ({"method": {"backtrack": -1}}, ["method.backtrack"]),
        (
            {"method": {"backtrack_patience": 2}},
            ["method.backtrack_patience", "method.backtrack > 0"],
        ),
        ({"method": {"backtrack": 1, "backtrack_patience": 0}}, ["backtrack_patience"]),
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


def test_single_robustness_options_override_the_variant():
    config = minimal()
    config["method"] = {
        "name": "dynamics",
        "variant": "robust",
        "target_noise": 2.0,
        "calibration": False,
        "target_floor": 0.05,
    }
    options = RunConfig.from_dict(config).method.robust_options()
    assert (options.target_noise, options.calibration, options.target_floor) == (2.0, False, 0.05)
    assert options.gain_exponent == VARIANTS["robust"].gain_exponent  # the rest from the variant
    config["method"] = {"name": "dynamics", "variant": "paper"}
    assert RunConfig.from_dict(config).method.robust_options().is_paper


def test_every_setting_the_protocol_measures_is_a_valid_method_config():
    """The benchmark's labelled settings are parsed as a user's config would be, and every
    option they name reaches the run's options (a misspelt one would be refused here rather
    than an hour into the protocol)."""
    for label, settings in METHODS.items():
        config = minimal()
        config["method"] = {"name": "dynamics", "schedule": "dense-warmup", **settings}
        method = RunConfig.from_dict(config).method
        options = method.robust_options()
        for key, value in settings.items():
            if key in (
                "variant",
                "schedule",
                "probe_cap",
                "probe_min",
                "min_weight",
                "backtrack",
                "backtrack_patience",
            ):
                assert getattr(method, key) == value, (label, key)
            else:
                assert getattr(options, key) == value, (label, key)


def test_an_option_set_turns_off_the_variants_options_that_need_what_it_turns_off():
    # The default's answer tolerance reads expected accuracies: turning them off turns the
    # tolerance off, unless it is set too.
    config = minimal()
    assert VARIANTS["robust"].answer_tolerance == 0.5 and VARIANTS["robust"].target_floor == 0.02
    config["method"] = {"name": "dynamics", "expected_accuracy": False}
    options = RunConfig.from_dict(config).method.robust_options()
    assert (options.expected_accuracy, options.answer_tolerance, options.target_floor) == (
        False,
        0.0,
        0.02,
    )
    config["method"] = {"name": "dynamics", "expected_accuracy": False, "answer_tolerance": 0.5}
    with pytest.raises(ConfigError, match=r"answer_tolerance .* expected_accuracy is off"):
        RunConfig.from_dict(config)


def test_the_direct_candidate_is_on_where_an_option_needs_it_never_over_a_users_false():
    config = minimal()
    config["method"] = {"name": "dynamics", "variant": "paper", "target_noise": 1.0}
    assert RunConfig.from_dict(config).method.robust_options().lp_candidate
    config["method"] = {"name": "dynamics", "variant": "paper", "gain_exponent": 0.5}
    assert RunConfig.from_dict(config).method.robust_options().lp_candidate
    config["method"] = {"name": "dynamics", "lp_candidate": False, "target_noise": 1.0}
    with pytest.raises(
        ConfigError, match=r"target_noise and gain_exponent act through the direct candidate"
    ):
        RunConfig.from_dict(config)


def test_dynamics_runs_the_default_variant_and_the_saved_config_names_it():
    config = minimal()
    config["method"] = {"name": "dynamics"}
    parsed = RunConfig.from_dict(config)
    assert parsed.method.variant == DEFAULT_VARIANT == "robust"
    assert parsed.method.robust_options() == VARIANTS["robust"]
    assert yaml.safe_load(parsed.to_yaml())["method"]["variant"] == "robust"
    assert (
        RunConfig.from_dict(yaml.safe_load(parsed.to_yaml())) == parsed
    )  # what a resume reads back


def test_methods_without_probes_have_no_variant():
    config = minimal()
    config["method"] = {"name": "fixed", "weights": {"math": 1.0, "wiki": 1.0}}
    parsed = RunConfig.from_dict(config)
    assert parsed.method.variant is None and parsed.method.robust_options().is_paper
    assert RunConfig.from_dict(yaml.safe_load(parsed.to_yaml())) == parsed
    # A saved config may say variant: paper for a fixed run; it reads as no variant, so the
    # run it belongs to resumes with the same config.
    config["method"]["variant"] = "paper"
    assert RunConfig.from_dict(config) == parsed
    config["method"]["variant"] = "robust"
    with pytest.raises(ConfigError, match=r"only method\.name: dynamics uses them"):
        RunConfig.from_dict(config)
