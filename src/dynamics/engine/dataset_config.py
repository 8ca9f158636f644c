"""``datasets:`` entries of the run config: where a dataset's rows come from, its role
(target, non-target, constraint), format, metric and sizes (docs/config.md)."""

from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING, Annotated, Any, Literal

import datasets
from pydantic import Field, create_model, field_validator, model_validator
from pydantic.fields import FieldInfo

from dynamics.data.errors import DataError
from dynamics.data.formats import FORMATS, LM_EVAL_CHOICES
from dynamics.data.source import DataSource
from dynamics.engine.config_sections import ConfigSection

COLUMN_KEYS: tuple[str, ...] = tuple(
    f.name.removesuffix("_column")
    for f in dataclasses.fields(DataSource)
    if f.name.endswith("_column")
)
"""The keys of ``columns``: ``DataSource``'s ``*_column`` fields without the suffix."""

CONFIG_ONLY = ("eval_size", "test_size", "drop_empty", "strip_strings", "metric")
"""``DataSource`` fields the config declares itself: its defaults differ (the held-out sizes
follow the role, the metric is ``loss`` unless set) or YAML writes them as lists."""

REQUIRED = ("name",)
"""``DataSource`` fields that a run config must set (a ``str``, not ``None``)."""


def _source_fields() -> dict[str, Any]:
    """The fields of a dataset entry that ``DataSource`` describes: each ``DataSource`` field
    whose annotated type carries pydantic ``Field`` metadata (its description and
    constraints), with ``DataSource``'s default, in ``DataSource``'s order."""
    hints = typing.get_type_hints(DataSource, include_extras=True)
    fields: dict[str, Any] = {}
    for source_field in dataclasses.fields(DataSource):
        hint = hints[source_field.name]
        described = typing.get_origin(hint) is Annotated and any(
            isinstance(meta, FieldInfo) for meta in hint.__metadata__
        )
        if not described or source_field.name in CONFIG_ONLY:
            continue
        if source_field.default_factory is not dataclasses.MISSING:
            default: Any = Field(default_factory=source_field.default_factory)
        else:
            default = source_field.default
        if source_field.name in REQUIRED:
            hint, default = Annotated[(str, *hint.__metadata__)], ...
        fields[source_field.name] = (hint, default)
    return fields


if TYPE_CHECKING:

    class _SourceFields(ConfigSection):
        """What a type checker sees of the fields built from ``DataSource``'s: any type."""

        def __getattr__(self, name: str) -> Any: ...

else:
    _SourceFields = create_model("SourceFields", __base__=ConfigSection, **_source_fields())


class DatasetConfig(_SourceFields):
    # The fields a run config adds to DataSource's (a class docstring would become the
    # description of the config's JSON schema): the role, metric, column names, held-out
    # sizes and evaluation batch size.

    role: Literal["target", "non-target", "constraint"] = Field(
        ...,
        description="target: trained and minimised; non-target: trained only; "
        "constraint: evaluated only.",
    )
    metric: Literal["loss", "accuracy"] = Field(
        "loss",
        description="Constraint metric; accuracy needs format multiple_choice. A multiple_choice "
        "constraint on loss is the loss of the correct answer's text after the question.",
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Column names when they differ from the defaults; "
        f"keys: {', '.join(COLUMN_KEYS)}.",
    )
    eval_size: int | float | None = Field(
        None,
        description="Rows held out for evaluation: a count or a fraction "
        "(default 0.1; 0.5 for constraints).",
    )
    test_size: int | float | None = Field(
        None, description="Rows held out for the test split, as eval_size."
    )
    eval_batch_size: int | None = Field(
        None,
        ge=1,
        description="Evaluation batch size of this domain (default: "
        "evaluation.batch_size). Larger for short rows, e.g. an accuracy constraint, where "
        "each question of a small sample moves it a lot.",
    )
    drop_empty: list[str] = Field(
        default_factory=list,
        description="Columns whose rows are dropped where they are empty or null.",
    )
    strip_strings: list[str] = Field(
        default_factory=list,
        description="Literal strings removed from every string column of each row, e.g. a "
        "tokenizer's control token written into the data ('<|endoftext|>').",
    )

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
                f"dataset {self.name!r}: revision {self.revision!r} pins a hub dataset's version; "
                "set hub_id, or remove revision for a local path"
            )
        # Neither: the rows are passed in Python (dynamics.run(config, data={name: rows})).
        unknown = sorted(set(self.columns) - set(COLUMN_KEYS))
        if unknown:
            raise ValueError(
                f"dataset {self.name!r}: unknown columns keys {unknown}; use {list(COLUMN_KEYS)}"
            )
        if self.lm_eval_task is not None or self._lm_eval_settings():
            self._check_lm_eval()
        elif self.metric not in FORMATS[self.format].metrics:
            scored = " or ".join(repr(n) for n, f in FORMATS.items() if self.metric in f.metrics)
            raise ValueError(f"dataset {self.name!r}: metric {self.metric!r} needs format {scored}")
        trainable = FORMATS[self.format].trainable or self.lm_eval_task is not None
        if not trainable and self.role != "constraint":
            raise ValueError(
                f"dataset {self.name!r}: format {self.format} is evaluated only (by its metric) "
                "and can only be a constraint: set role: constraint"
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
                        f"dataset {self.name!r}: {split} is 0, but a {self.role} is "
                        "evaluated on its eval split and reported on its test split; give "
                        f"{split} > 0 (or leave it unset)"
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
                f"dataset {self.name!r}: {', '.join(self._lm_eval_settings())} configure "
                "lm_eval_task; set lm_eval_task"
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
            if "format" in self.model_fields_set and self.format != LM_EVAL_CHOICES.name
            else []
        )
        if given:
            raise ValueError(
                f"dataset {self.name!r}: lm_eval_task {self.lm_eval_task!r} builds its rows with "
                f"the task's own split, prompts and choices; remove {', '.join(given)}"
            )
        if self.metric == "accuracy" and self.role != "constraint":
            raise ValueError(
                f"dataset {self.name!r}: accuracy on lm_eval_task {self.lm_eval_task!r} is "
                "evaluated only and can only be a constraint: set role: constraint, or metric: "
                "loss to train on the correct continuations"
            )

    def data_source(self, rows: datasets.Dataset | None = None) -> DataSource:
        """The data layer's spec of this dataset, reading ``rows`` (in memory) when given
        instead of its path or hub id. Constraint domains are evaluation-only, so their rows
        are split between eval and test (half each unless set)."""
        shared: dict[str, Any] = {name: getattr(self, name) for name in SHARED_FIELDS}
        if self.lm_eval_task is not None:
            shared["format"] = LM_EVAL_CHOICES.name
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


SHARED_FIELDS: tuple[str, ...] = (*_source_fields(), "metric")
"""The fields ``data_source`` passes to ``DataSource`` as they are: those built from
``DataSource``'s (``dynamics.data.source``'s annotated types) and the metric."""
