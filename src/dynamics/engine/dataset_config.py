"""``datasets:`` entries of the run config: where a dataset's rows come from, its role
(target, non-target, constraint), format, metric and sizes (docs/config.md)."""

from __future__ import annotations

from typing import Any, Literal

import datasets
from pydantic import Field, field_validator, model_validator

from dynamics.data.loading import DataError, DataSource, check_data_files
from dynamics.engine.config_section import ConfigSection

COLUMN_KEYS = ("text", "prompt", "response", "completion", "system", "messages", "question", "choices", "answer")


class DatasetConfig(ConfigSection):
    name: str = Field(..., min_length=1, description="Short unique name, used in logs and weights.")
    path: str | None = Field(None, description="Local file (jsonl/json/parquet/txt) or dataset folder.")
    hub_id: str | None = Field(None, description="Hugging Face hub dataset id (instead of path).")
    config_name: str | None = Field(None, description="Hub dataset configuration, if it has several.")
    revision: str | None = Field(
        None,
        min_length=1,
        description="Hub dataset revision to read (a branch, tag or commit; datasets.load_dataset's revision); "
        "needs hub_id.",
    )
    data_files: str | list[str] | dict[str, str | list[str]] | None = Field(
        None,
        description="Files of the hub dataset (or local folder) to read, datasets.load_dataset's data_files: a path "
        "or glob, a list of them, or split -> path(s); e.g. the .jsonl of a repository that also holds a .csv "
        "and declares no configs.",
    )
    split: str = Field("train", description="Split to read; slices work, e.g. 'train[:20000]'.")
    role: Literal["target", "non-target", "constraint"] = Field(
        ..., description="target: trained and minimised; non-target: trained only; constraint: evaluated only."
    )
    format: Literal["text", "instruction", "multiple_choice"] = Field(
        "text",
        description="Row format: plain text, prompt/response pairs (or messages, or TRL's prompt/completion: "
        "strings or message lists), or multiple choice.",
    )
    loss_on: Literal["last-assistant", "all-assistant"] = Field(
        "last-assistant",
        description="Instruction rows: the loss on the response only (the last assistant message, or a "
        "prompt/completion pair's completion; TRL's completion_only_loss), or on every assistant turn (of the "
        "completion, for a pair; TRL's assistant_only_loss).",
    )
    metric: Literal["loss", "accuracy"] = Field(
        "loss",
        description="Constraint metric; accuracy needs format multiple_choice. A multiple_choice "
        "constraint on loss is the loss of the correct answer's text after the question.",
    )
    budget: int | None = Field(None, ge=1, description="Training rows to use (null: all, e.g. an unlimited corpus).")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description=f"Column names when they differ from the defaults; keys: {', '.join(COLUMN_KEYS)}.",
    )
    eval_size: int | float | None = Field(
        None, description="Rows held out for evaluation: a count or a fraction (default 0.1; 0.5 for constraints)."
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
    fields: dict[str, str | list[str]] = Field(
        default_factory=dict,
        description="Columns built from each row before formatting, by name: a template over columns "
        "('{document}\\n\\nQuestion: {question}'), a nested column path ('mc1_targets.choices') or a "
        "list of column paths (choices spread over several columns).",
    )
    drop_empty: list[str] = Field(
        default_factory=list, description="Columns whose rows are dropped where they are empty or null."
    )
    truncation_side: Literal["right", "left"] = Field(
        "right",
        description="Which end of a too-long example is cut: left keeps the response and the end of "
        "a long prompt (a document before a question), right keeps the start.",
    )
    stream_rows: int | None = Field(
        None,
        ge=1,
        description="Read the split as a stream (datasets streaming) and keep this many rows, shuffled "
        "first (stream_seed, stream_shuffle_buffer), cached on disk after the first read: for huge corpora, "
        "never downloaded whole.",
    )
    stream_seed: int = Field(0, ge=0, description="Seed of the shuffle of a stream before its rows are kept.")
    stream_shuffle_buffer: int = Field(
        10_000,
        ge=0,
        description="Rows of the buffer a stream is shuffled through (IterableDataset.shuffle; the shards' "
        "order is shuffled too); 0 keeps the stream's first rows.",
    )
    shuffle_choices: bool = Field(
        False,
        description="Multiple choice: shuffle each question's choices in an order seeded by the question "
        "(the same on every run), for a benchmark whose correct choice is always at one index.",
    )
    strip_strings: list[str] = Field(
        default_factory=list,
        description="Literal strings removed from every string column of each row, e.g. a tokenizer's control "
        "token written into the data ('<|endoftext|>').",
    )
    lm_eval_task: str | None = Field(
        None,
        min_length=1,
        description="An lm-evaluation-harness multiple-choice task (e.g. tinyMMLU) whose documents are the rows, "
        "built by the task's own prompts, choices, answers, few-shot setting and split (instead of path or "
        "hub_id; needs the extra lm-eval). metric accuracy is lm-eval's acc (the choice whose continuation is "
        "likeliest; constraints only), loss the loss of the correct choice's continuation (any role). "
        "docs/lm-eval.md.",
    )
    lm_eval_include_path: str | None = Field(
        None,
        min_length=1,
        description="A folder of lm-eval task YAMLs searched for lm_eval_task (a task over local files).",
    )

    @field_validator("eval_size", "test_size", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any) -> Any:
        # `eval_size: true` would silently become 1 row.
        if isinstance(value, bool):
            raise ValueError(f"a row count (int) or a fraction (float), not {str(value).lower()}")
        return value

    @field_validator("data_files", mode="before")
    @classmethod
    def _data_files_shape(cls, value: Any) -> Any:
        # One message naming the accepted shapes, instead of one error per member of the union.
        if value is not None:
            try:
                check_data_files(value)
            except DataError as err:
                raise ValueError(str(err)) from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DatasetConfig:
        if self.path is not None and self.hub_id is not None:
            raise ValueError(f"dataset {self.name!r}: set only one of path (a local file) or hub_id")
        if self.revision is not None and self.hub_id is None:
            raise ValueError(
                f"dataset {self.name!r}: revision {self.revision!r} pins a hub dataset's version; set hub_id, or "
                "remove revision for a local path"
            )
        # Neither: the rows are passed in Python (dynamics.run(config, data={name: rows})).
        unknown = sorted(set(self.columns) - set(COLUMN_KEYS))
        if unknown:
            raise ValueError(f"dataset {self.name!r}: unknown columns keys {unknown}; use {list(COLUMN_KEYS)}")
        if self.lm_eval_task is not None or self.lm_eval_include_path is not None:
            self._check_lm_eval()
        elif self.metric == "accuracy" and self.format != "multiple_choice":
            raise ValueError(f"dataset {self.name!r}: metric 'accuracy' needs format 'multiple_choice'")
        if self.format == "multiple_choice" and self.role != "constraint" and self.lm_eval_task is None:
            raise ValueError(
                f"dataset {self.name!r}: multiple-choice data is evaluated only (by accuracy or by the loss "
                "of the correct answer) and can only be a constraint: set role: constraint"
            )
        if self.role == "constraint" and self.budget is not None:
            raise ValueError(f"dataset {self.name!r}: a constraint is evaluated only; remove its budget")
        if self.role == "non-target" and self.eval_batch_size is not None:
            raise ValueError(f"dataset {self.name!r}: a non-target is not evaluated; remove its eval_batch_size")
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

    def _check_lm_eval(self) -> None:
        if self.lm_eval_task is None:
            raise ValueError(f"dataset {self.name!r}: lm_eval_include_path is searched for lm_eval_task; set lm_eval_task")
        fields = ("path", "hub_id", "config_name", "revision", "data_files", "stream_rows")
        given = [f for f in fields if getattr(self, f) is not None]
        given += [f for f in ("columns", "fields", "drop_empty", "strip_strings", "shuffle_choices") if getattr(self, f)]
        given += ["format"] if "format" in self.model_fields_set and self.format != "multiple_choice" else []
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
        if rows is not None:
            rows_source = {"path": None, "hub_id": None, "rows": rows}
        else:
            rows_source = {"path": self.path, "hub_id": self.hub_id}
        if self.lm_eval_task is not None:
            rows_source = {"lm_eval_task": self.lm_eval_task, "lm_eval_include_path": self.lm_eval_include_path}
        default_held_out = 0.5 if self.role == "constraint" else 0.1
        columns = {f"{key}_column": value for key, value in self.columns.items()}
        return DataSource(
            name=self.name,
            trained=self.role != "constraint",
            evaluated=self.role != "non-target",
            **rows_source,
            config_name=self.config_name,
            split=self.split,
            format="multiple_choice" if self.lm_eval_task is not None else self.format,
            budget=self.budget,
            eval_size=default_held_out if self.eval_size is None else self.eval_size,
            test_size=default_held_out if self.test_size is None else self.test_size,
            fields=self.fields,
            drop_empty=tuple(self.drop_empty),
            stream_rows=self.stream_rows,
            stream_seed=self.stream_seed,
            stream_shuffle_buffer=self.stream_shuffle_buffer,
            truncation_side=self.truncation_side,
            metric=self.metric,
            revision=self.revision,
            data_files=self.data_files,
            loss_on=self.loss_on,
            shuffle_choices=self.shuffle_choices,
            strip_strings=tuple(self.strip_strings),
            **columns,
        )
