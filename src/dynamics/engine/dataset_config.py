"""``datasets:`` entries of the run config: where a dataset's rows come from, its role
(target, non-target, constraint), format, metric and sizes (docs/config.md)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import datasets
from pydantic import Field, field_validator, model_validator

from dynamics.data.loading import (
    STREAM_SHUFFLE_BUFFER,
    Budget,
    ChatTemplateKwargs,
    ChatTemplatePath,
    ConfigName,
    DataError,
    DataFilesField,
    DataSource,
    Fields,
    Format,
    HubId,
    LmEvalApplyChatTemplate,
    LmEvalFewshotAsMultiturn,
    LmEvalIncludePath,
    LmEvalMetric,
    LmEvalNumFewshot,
    LmEvalSystemInstruction,
    LmEvalTask,
    LossOnField,
    Revision,
    ShuffleChoices,
    SourcePath,
    Split,
    StreamRows,
    StreamSeed,
    StreamShuffleBuffer,
    TruncationSide,
)
from dynamics.engine.config_sections import ConfigSection

COLUMN_KEYS = (
    "text",
    "prompt",
    "response",
    "completion",
    "system",
    "messages",
    "tools",
    "question",
    "choices",
    "answer",
)


class DatasetConfig(ConfigSection):
    # The fields shared with DataSource are typed, described and constrained once, by the
    # annotated types of dynamics.data.loading; the others are what the run config adds (the
    # name, role, metric, column names, held-out sizes and evaluation batch size). A class
    # docstring would become the description of the config's JSON schema.

    name: str = Field(..., min_length=1, description="Short unique name, used in logs and weights.")
    path: SourcePath = None
    hub_id: HubId = None
    config_name: ConfigName = None
    revision: Revision = None
    data_files: DataFilesField = None
    split: Split = "train"
    role: Literal["target", "non-target", "constraint"] = Field(
        ...,
        description="target: trained and minimised; non-target: trained only; constraint: evaluated only.",
    )
    format: Format = "text"
    loss_on: LossOnField = "last-assistant"
    chat_template_path: ChatTemplatePath = None
    chat_template_kwargs: ChatTemplateKwargs = Field(default_factory=dict)
    metric: Literal["loss", "accuracy"] = Field(
        "loss",
        description="Constraint metric; accuracy needs format multiple_choice. A multiple_choice "
        "constraint on loss is the loss of the correct answer's text after the question.",
    )
    budget: Budget = None
    columns: dict[str, str] = Field(
        default_factory=dict,
        description=f"Column names when they differ from the defaults; keys: {', '.join(COLUMN_KEYS)}.",
    )
    eval_size: int | float | None = Field(
        None,
        description="Rows held out for evaluation: a count or a fraction (default 0.1; 0.5 for constraints).",
    )
    test_size: int | float | None = Field(
        None, description="Rows held out for the test split, as eval_size."
    )
    eval_batch_size: int | None = Field(
        None,
        ge=1,
        description="Evaluation batch size of this domain (default: evaluation.batch_size). Larger for "
        "short rows, e.g. an accuracy constraint, where each question of a small sample moves it a lot.",
    )
    fields: Fields = Field(default_factory=dict)
    drop_empty: list[str] = Field(
        default_factory=list,
        description="Columns whose rows are dropped where they are empty or null.",
    )
    truncation_side: TruncationSide = "right"
    stream_rows: StreamRows = None
    stream_seed: StreamSeed = 0
    stream_shuffle_buffer: StreamShuffleBuffer = STREAM_SHUFFLE_BUFFER
    shuffle_choices: ShuffleChoices = False
    strip_strings: list[str] = Field(
        default_factory=list,
        description="Literal strings removed from every string column of each row, e.g. a tokenizer's control "
        "token written into the data ('<|endoftext|>').",
    )
    lm_eval_task: LmEvalTask = None
    lm_eval_include_path: LmEvalIncludePath = None
    lm_eval_metric: LmEvalMetric = "acc"
    lm_eval_num_fewshot: LmEvalNumFewshot = None
    lm_eval_system_instruction: LmEvalSystemInstruction = None
    lm_eval_apply_chat_template: LmEvalApplyChatTemplate = False
    lm_eval_fewshot_as_multiturn: LmEvalFewshotAsMultiturn = True

    @field_validator("eval_size", "test_size", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any) -> Any:
        # `eval_size: true` would silently become 1 row.
        if isinstance(value, bool):
            raise ValueError(f"a row count (int) or a fraction (float), not {str(value).lower()}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DatasetConfig:
        if self.path is not None and self.hub_id is not None:
            raise ValueError(
                f"dataset {self.name!r}: set only one of path (a local file) or hub_id"
            )
        if self.revision is not None and self.hub_id is None:
            raise ValueError(
                f"dataset {self.name!r}: revision {self.revision!r} pins a hub dataset's version; set hub_id, or "
                "remove revision for a local path"
            )
        # Neither: the rows are passed in Python (dynamics.run(config, data={name: rows})).
        unknown = sorted(set(self.columns) - set(COLUMN_KEYS))
        if unknown:
            raise ValueError(
                f"dataset {self.name!r}: unknown columns keys {unknown}; use {list(COLUMN_KEYS)}"
            )
        if self.lm_eval_task is not None or self._lm_eval_settings():
            self._check_lm_eval()
        elif self.metric == "accuracy" and self.format != "multiple_choice":
            raise ValueError(
                f"dataset {self.name!r}: metric 'accuracy' needs format 'multiple_choice'"
            )
        if (
            self.format == "multiple_choice"
            and self.role != "constraint"
            and self.lm_eval_task is None
        ):
            raise ValueError(
                f"dataset {self.name!r}: multiple-choice data is evaluated only (by accuracy or by the loss "
                "of the correct answer) and can only be a constraint: set role: constraint"
            )
        if self.role == "constraint" and self.budget is not None:
            raise ValueError(
                f"dataset {self.name!r}: a constraint is evaluated only; remove its budget"
            )
        if self.role == "non-target" and self.eval_batch_size is not None:
            raise ValueError(
                f"dataset {self.name!r}: a non-target is not evaluated; remove its eval_batch_size"
            )
        if self.role != "non-target":
            for split in ("eval_size", "test_size"):
                if getattr(self, split) == 0:
                    raise ValueError(
                        f"dataset {self.name!r}: {split} is 0, but a {self.role} is evaluated on its eval "
                        f"split and reported on its test split; give {split} > 0 (or leave it unset)"
                    )
        try:
            self.data_source()  # the data layer's own checks of sizes and budget
        except DataError as err:
            raise ValueError(f"dataset {self.name!r}: {err}") from None
        return self

    def _lm_eval_settings(self) -> list[str]:
        """The lm_eval_* fields other than lm_eval_task set to other than their defaults (a
        written config repeats the defaults)."""
        return sorted(
            name
            for name, info in type(self).model_fields.items()
            if name.startswith("lm_eval_")
            and name != "lm_eval_task"
            and getattr(self, name) != info.default
        )

    def _check_lm_eval(self) -> None:
        if self.lm_eval_task is None:
            raise ValueError(
                f"dataset {self.name!r}: {', '.join(self._lm_eval_settings())} configure lm_eval_task; set lm_eval_task"
            )
        fields = ("path", "hub_id", "config_name", "revision", "data_files", "stream_rows")
        given = [f for f in fields if getattr(self, f) is not None]
        given += [
            f
            for f in ("columns", "fields", "drop_empty", "strip_strings", "shuffle_choices")
            if getattr(self, f)
        ]
        given += (
            ["format"]
            if "format" in self.model_fields_set and self.format != "multiple_choice"
            else []
        )
        if given:
            raise ValueError(
                f"dataset {self.name!r}: lm_eval_task {self.lm_eval_task!r} builds its rows with the task's own "
                f"split, prompts and choices; remove {', '.join(given)}"
            )
        if self.metric == "accuracy" and self.role != "constraint":
            raise ValueError(
                f"dataset {self.name!r}: accuracy on lm_eval_task {self.lm_eval_task!r} is evaluated only and "
                "can only be a constraint: set role: constraint, or metric: loss to train on the correct "
                "continuations"
            )

    def data_source(self, rows: datasets.Dataset | None = None) -> DataSource:
        """The data layer's spec of this dataset, reading ``rows`` (in memory) when given
        instead of its path or hub id. Constraint domains are evaluation-only, so their rows
        are split between eval and test (half each unless set)."""
        shared: dict[str, Any] = {name: getattr(self, name) for name in SHARED_FIELDS}
        if self.lm_eval_task is not None:
            shared["format"] = "multiple_choice"
        elif rows is not None:
            shared.update(path=None, hub_id=None, rows=rows)
        default_held_out = 0.5 if self.role == "constraint" else 0.1
        columns: dict[str, Any] = {f"{key}_column": value for key, value in self.columns.items()}
        return DataSource(
            **shared,
            trained=self.role != "constraint",
            evaluated=self.role != "non-target",
            eval_size=default_held_out if self.eval_size is None else self.eval_size,
            test_size=default_held_out if self.test_size is None else self.test_size,
            drop_empty=tuple(self.drop_empty),
            strip_strings=tuple(self.strip_strings),
            **columns,
        )


SHARED_FIELDS: tuple[str, ...] = tuple(
    f.name
    for f in dataclasses.fields(DataSource)
    if f.name in DatasetConfig.model_fields
    and f.name not in ("eval_size", "test_size", "drop_empty", "strip_strings")
)
"""The fields ``data_source`` passes to ``DataSource`` as they are: the name, the metric and
the fields the two share (``dynamics.data.loading``'s annotated types)."""
