"""The row-format registry: every format is looked up by its name, in the loader and in the
run config, and a run config's dataset entry takes its fields from ``DataSource``."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from pydantic.fields import FieldInfo

from dynamics.data.errors import DataError
from dynamics.data.formats import FORMATS, format_of
from dynamics.data.formats.lm_eval_choices import LM_EVAL_CHOICES
from dynamics.data.formats.registry import register
from dynamics.data.formats.text import TextFormat
from dynamics.data.source import DataSource
from dynamics.engine.config import ConfigError, RunConfig
from dynamics.engine.dataset_config import DatasetConfig


def test_the_registry_holds_the_formats_by_name() -> None:
    assert {"text", "instruction", "multiple_choice"} <= set(FORMATS)
    for name, row_format in FORMATS.items():
        assert row_format.name == name
        source = DataSource(path="rows.jsonl", format=name)
        assert format_of(source) is row_format
        assert source.metric == row_format.metrics[0]  # the format's default metric


def test_the_format_field_is_documented_from_every_format_summary() -> None:
    description = DatasetConfig.model_fields["format"].description
    assert description is not None
    for name, row_format in FORMATS.items():
        assert f"{name} ({row_format.summary})" in description


def test_a_format_without_a_summary_or_a_second_of_one_name_is_refused() -> None:
    class Unsummarised(TextFormat):
        name = "unsummarised"
        summary = ""

    with pytest.raises(ValueError, match="Unsummarised sets no summary: give the class one"):
        register(Unsummarised())
    with pytest.raises(ValueError, match="row format 'text' is registered twice"):
        register(TextFormat())
    assert "unsummarised" not in FORMATS


def test_an_lm_eval_source_is_read_with_the_lm_eval_format() -> None:
    source = DataSource(lm_eval_task="tinyMMLU", format="multiple_choice")
    assert format_of(source) is LM_EVAL_CHOICES


def test_an_unknown_format_names_every_registered_one() -> None:
    with pytest.raises(DataError, match="format='chat': use one of") as raised:
        DataSource(path="rows.jsonl", format="chat")
    for name in FORMATS:
        assert name in str(raised.value)


def test_a_config_with_an_unknown_format_gets_one_line_naming_the_field_and_formats() -> None:
    data = {
        "model": {"name_or_path": "Qwen/Qwen2.5-3B"},
        "datasets": [{"name": "chat", "path": "c.jsonl", "role": "target", "format": "chat"}],
    }
    with pytest.raises(ConfigError) as raised:
        RunConfig.from_dict(data)
    message = str(raised.value)
    assert "\n" not in message
    assert "datasets.0.format: Input should be" in message
    for name in FORMATS:
        assert repr(name) in message


def _described_source_fields() -> dict[str, str]:
    """``DataSource``'s fields whose annotated type holds a pydantic description."""
    hints = typing.get_type_hints(DataSource, include_extras=True)
    described = {}
    for field in dataclasses.fields(DataSource):
        for meta in getattr(hints[field.name], "__metadata__", ()):
            if isinstance(meta, FieldInfo) and meta.description:
                described[field.name] = meta.description
    return described


def test_a_dataset_entry_takes_its_fields_from_data_source() -> None:
    described = _described_source_fields()
    assert {"path", "hub_id", "format", "loss_on", "lm_eval_task"} <= set(described)
    # DatasetConfig writes none of them again: each comes from DataSource, description included.
    assert not set(DatasetConfig.__annotations__) & set(described)
    for name, description in described.items():
        assert DatasetConfig.model_fields[name].description == description


def test_a_format_evaluated_only_is_a_constraint_only() -> None:
    trainable = {name for name, row_format in FORMATS.items() if row_format.trainable}
    assert {"text", "instruction"} <= trainable
    assert "multiple_choice" not in trainable
    for name in trainable:
        DatasetConfig(name="d", path="d.jsonl", format=name, role="target")
    with pytest.raises(ValueError, match="can only be a constraint: set role: constraint"):
        DatasetConfig(name="d", path="d.jsonl", format="multiple_choice", role="target")
    DatasetConfig(name="d", path="d.jsonl", format="multiple_choice", role="constraint")
