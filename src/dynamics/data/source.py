"""One dataset described once: ``DataSource``, what the loader reads, and the annotated types
of its fields, which a run config's ``datasets:`` entry takes as they are.

Public API:

- ``DataSource``: frozen spec of one dataset: a local file or folder (``path``), a hub id
  (``hub_id`` + optional ``config_name``), rows in memory (``rows``) or an lm-eval task
  (``lm_eval_task``); the split to read, the row ``format`` (a name of
  ``dynamics.data.formats.FORMATS``), the column names, the sample ``budget`` and the sizes
  of the held-out ``eval`` and ``test`` splits. It checks its values when built and raises
  ``DataError`` naming the field and the fix.
- ``Name``, ``SourcePath``, ... ``LmEvalSystemInstruction``: the annotated types of the
  fields a run config's dataset entry shares (``dynamics.engine.dataset_config`` builds its
  fields from them), each holding the field's description and the constraints the config
  validates (pydantic ``Field`` metadata, which the ``DataSource`` dataclass ignores: it
  checks its values itself).
- ``check_data_files(value)``: that ``data_files`` has one of ``load_dataset``'s shapes.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import datasets
from pydantic import BeforeValidator, Field

from dynamics.data.errors import DataError
from dynamics.data.formats import FORMATS, LM_EVAL_CHOICES, format_names, format_summaries

if TYPE_CHECKING:
    FormatName = str
else:
    # The registry's names, as a Literal: pydantic's error for another name lists them all.
    FormatName = Literal[format_names()]
"""A row format's name: a key of ``dynamics.data.formats.FORMATS``."""

ChoiceMetric = Literal["accuracy", "loss"]
LossOn = Literal["last-assistant", "all-assistant"]
LOSS_ON: tuple[str, ...] = ("last-assistant", "all-assistant")
CHAT_TEMPLATE_ARGUMENTS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "return_dict",
        "return_assistant_tokens_mask",
        "return_tensors",
        "padding",
        "truncation",
        "max_length",
        "tokenizer_kwargs",
    }
)
"""Arguments of ``apply_chat_template`` that the formatting sets: not ``chat_template_kwargs``."""
DataFiles = str | list[str] | dict[str, str | list[str]]
"""``load_dataset``'s ``data_files``: a path or glob, a list of them, or split -> path(s)."""
STREAM_SHUFFLE_BUFFER = 10_000
"""Rows of the buffer a stream is shuffled through before ``stream_rows`` are kept."""
FieldSpec = str | list[str]
"""How ``DataSource.fields`` builds one column: a template with ``{column}`` placeholders
(``str.format`` syntax, so ``{choices[text]}`` reads a nested key), a column path
(``mc1_targets.choices``; dots go into nested dicts), or a list of paths (a list column)."""


def _check_split_size(field: str, value: int | float) -> None:
    # bool is an int subclass; `eval_size: true` in a YAML file is a mistake, not a count.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DataError(f"{field} must be a row count (int) or a fraction (float), got {value!r}")
    if isinstance(value, int) and value < 0:
        raise DataError(f"{field}={value}: a row count must be >= 0")
    if isinstance(value, float) and not 0.0 <= value <= 1.0:
        raise DataError(f"{field}={value}: a fraction must lie in [0, 1]")


def _data_files_shape(value: Any) -> Any:
    """Pydantic's check of ``data_files``: one message naming the accepted shapes, instead of
    one error per member of the union."""
    if value is not None:
        try:
            check_data_files(value)
        except DataError as err:
            raise ValueError(str(err)) from None
    return value


# The fields ``DataSource`` shares with a run config's ``datasets:`` entry
# (``dynamics.engine.dataset_config.DatasetConfig``), each written once here: its type, its
# description (docs/config.md) and the constraints the config validates with pydantic.
# ``DataSource`` is a plain dataclass that ignores the pydantic metadata and checks its own
# values in ``__post_init__`` (raising ``DataError``).
Name = Annotated[
    str | None, Field(min_length=1, description="Short unique name, used in logs and weights.")
]
SourcePath = Annotated[
    str | None, Field(description="Local file (jsonl/json/parquet/txt) or dataset folder.")
]
HubId = Annotated[str | None, Field(description="Hugging Face hub dataset id (instead of path).")]
ConfigName = Annotated[
    str | None, Field(description="Hub dataset configuration, if it has several.")
]
Revision = Annotated[
    str | None,
    Field(
        min_length=1,
        description="Hub dataset revision to read (a branch, tag or commit; "
        "datasets.load_dataset's revision); needs hub_id.",
    ),
]
DataFilesField = Annotated[
    DataFiles | None,
    BeforeValidator(_data_files_shape),
    Field(
        description="Files of the hub dataset (or local folder) to read, datasets.load_dataset's "
        "data_files: a path or glob, a list of them, or split -> path(s); e.g. the .jsonl of a "
        "repository that also holds a .csv and declares no configs.",
    ),
]
Split = Annotated[str, Field(description="Split to read; slices work, e.g. 'train[:20000]'.")]
Format = Annotated[
    FormatName,
    Field(
        description=f"Row format: {format_summaries()} (docs/datasets.md).",
    ),
]
LossOnField = Annotated[
    LossOn,
    Field(
        description="Instruction rows: the loss on the response only (the last assistant message, "
        "or a prompt/completion pair's completion; TRL's completion_only_loss), or on every "
        "assistant turn (of the completion, for a pair; TRL's assistant_only_loss).",
    ),
]
Budget = Annotated[
    int | None,
    Field(ge=1, description="Training rows to use (null: all, e.g. an unlimited corpus)."),
]
Fields = Annotated[
    dict[str, FieldSpec],
    Field(
        description="Columns built from each row before formatting, by name: a template over "
        "columns ('{document}\\n\\nQuestion: {question}'), a nested column path "
        "('mc1_targets.choices') or a list of column paths (choices spread over several columns).",
    ),
]
TruncationSide = Annotated[
    Literal["right", "left"],
    Field(
        description="Which end of a too-long example is cut: left keeps the response and the end "
        "of a long prompt (a document before a question), right keeps the start.",
    ),
]
ChatTemplatePath = Annotated[
    str | None,
    Field(
        min_length=1,
        description="Instruction rows: a Jinja file rendering them instead of the tokenizer's chat "
        "template (as TRL's chat_template_path), e.g. one with {% generation %} blocks for loss_on "
        "all-assistant; relative paths are read from the working directory.",
    ),
]
ChatTemplateKwargs = Annotated[
    dict[str, Any],
    Field(
        description="Instruction rows: variables passed to the chat template "
        "(apply_chat_template's keyword arguments), e.g. {enable_thinking: false} for Qwen3.",
    ),
]
StreamRows = Annotated[
    int | None,
    Field(
        ge=1,
        description="Read the split as a stream (datasets streaming) and keep this many rows, "
        "shuffled first (stream_seed, stream_shuffle_buffer), cached on disk after the first read: "
        "for huge corpora, never downloaded whole.",
    ),
]
StreamSeed = Annotated[
    int, Field(ge=0, description="Seed of the shuffle of a stream before its rows are kept.")
]
StreamShuffleBuffer = Annotated[
    int,
    Field(
        ge=0,
        description="Rows of the buffer a stream is shuffled through (IterableDataset.shuffle; the "
        "shards' order is shuffled too); 0 keeps the stream's first rows.",
    ),
]
ShuffleChoices = Annotated[
    bool,
    Field(
        description="Multiple choice: shuffle each question's choices in an order "
        "seeded by the question (the same on every run), for a benchmark whose correct "
        "choice is always at one index.",
    ),
]
LmEvalTask = Annotated[
    str | None,
    Field(
        min_length=1,
        description="An lm-evaluation-harness multiple-choice task (e.g. tinyMMLU), or a group "
        "of them pooled into one dataset, whose documents are the rows, built by the task's "
        "own prompts, choices, answers, few-shot setting and split (instead of path or hub_id; "
        "needs the extra lm-eval). metric accuracy is lm-eval's acc or acc_norm "
        "(lm_eval_metric; constraints only), loss the loss of the correct choice's "
        "continuation (any role). docs/lm-eval.md.",
    ),
]
LmEvalIncludePath = Annotated[
    str | None,
    Field(
        min_length=1,
        description="A folder of lm-eval task YAMLs searched for "
        "lm_eval_task (a task over local files).",
    ),
]
LmEvalMetric = Annotated[
    Literal["acc", "acc_norm"],
    Field(
        description="Which of lm-eval's multiple-choice metrics metric accuracy is: acc (the "
        "choice whose continuation has the largest summed log-likelihood) or acc_norm (that sum "
        "divided by the choice's length in characters, e.g. tinyMMLU, tinyHellaswag); the task "
        "must report it. docs/lm-eval.md.",
    ),
]
LmEvalNumFewshot = Annotated[
    int | None,
    Field(
        ge=0,
        description="Few-shot examples before each document, as lm_eval --num_fewshot (a task "
        "whose config sets num_fewshot: 0 keeps 0); default: the task's own.",
    ),
]
LmEvalApplyChatTemplate = Annotated[
    bool,
    Field(
        description="lm_eval --apply_chat_template: each context (system instruction, "
        "few-shot examples, document) is put through the tokenizer's chat template, as "
        "lm-eval's hf model renders it.",
    ),
]
LmEvalFewshotAsMultiturn = Annotated[
    bool,
    Field(
        description="lm_eval --fewshot_as_multiturn, with lm_eval_apply_chat_template: the "
        "few-shot examples as turns of the chat (true, simple_evaluate's default) or all in "
        "the first user turn (false).",
    ),
]
LmEvalSystemInstruction = Annotated[
    str | None,
    Field(min_length=1, description="lm_eval --system_instruction: text put before each context."),
]


@dataclass(frozen=True)
class DataSource:
    """One dataset: where its rows are, how to read them, and how much of it to use.

    The fields typed by the annotated types above (``SourcePath`` ... ``LmEvalIncludePath``)
    are those a run config's dataset entry shares; their types hold their descriptions. The
    other fields are described here."""

    name: Name = None
    """The dataset's name in a run config (required there); error messages lead with it."""
    trained: bool = False
    """A run trains on this dataset: its training part must keep at least one example."""
    evaluated: bool = False
    """A run evaluates this dataset: its eval and test parts must keep an example each."""
    path: SourcePath = None
    hub_id: HubId = None
    rows: datasets.Dataset | None = field(default=None, compare=False, repr=False)
    """Rows already in memory (a notebook's ``datasets.Dataset``), read instead of a file;
    at most one of ``path``/``hub_id``/``rows``/``lm_eval_task``."""
    config_name: ConfigName = None
    revision: Revision = None
    data_files: DataFilesField = None
    split: Split = "train"
    format: Format = "text"
    text_column: str = "text"
    """Column of the documents of a ``text`` dataset."""
    prompt_column: str = "prompt"
    """Column of the user turn of an ``instruction`` dataset given as pairs (a string), or of
    the prompt's messages of a conversational prompt/completion pair (a list)."""
    response_column: str = "response"
    """Column of the assistant turn of an ``instruction`` dataset given as pairs."""
    completion_column: str = "completion"
    """TRL's name of the response column: read instead of ``response_column`` when the rows
    have it and not the response column. A string (the assistant turn) or, with a
    conversational prompt, a list of messages starting with the assistant's."""
    system_column: str | None = None
    """Optional column of a per-row system prompt (e.g. OpenOrca's ``system_prompt``)."""
    messages_column: str = "messages"
    """Column of a chat list of ``{"role", "content"}`` (with any other keys the chat template
    reads, e.g. ``tool_calls``, ``reasoning_content``); used instead of the pair columns
    whenever the rows have it. The last message is the response and must be the assistant's."""
    tools_column: str = "tools"
    """Column of a row's tool schemas (a list of JSON schemas, or its JSON text), passed to
    the chat template as ``tools=``; read whenever the rows have it."""
    loss_on: LossOnField = "last-assistant"
    chat_template_path: ChatTemplatePath = None
    chat_template_kwargs: ChatTemplateKwargs = field(default_factory=dict)
    question_column: str = "question"
    choices_column: str = "choices"
    """A list of choice texts, or a dict ``{"text": [...], "label": [...]}`` (ARC-style)."""
    answer_column: str = "answer"
    """The correct choice: a 0-based index, a letter (``"B"``), or one of the ARC labels."""
    shuffle_choices: ShuffleChoices = False
    budget: Budget = None
    eval_size: int | float = 0.1
    """Rows held out for the evaluation split: an int is a count, a float a fraction of the
    rows (rounded up). An evaluation-only domain uses e.g. ``eval_size=0.5, test_size=0.5``."""
    test_size: int | float = 0.1
    """Rows held out for the test split, as ``eval_size``."""
    metric: ChoiceMetric | None = None
    """How the domain is scored: one of its format's ``metrics``. ``multiple_choice``:
    ``accuracy`` scores the letter-restricted argmax, ``loss`` is the loss of the correct
    choice's text after the question (see ``formats.multiple_choice``). The other formats are
    scored by ``loss`` only. None (the default) becomes the format's first metric."""
    fields: Fields = field(default_factory=dict)
    drop_empty: tuple[str, ...] = ()
    """Columns whose empty or null rows are dropped (after ``fields``), e.g. a response
    column that some rows leave out."""
    stream_rows: StreamRows = None
    stream_seed: StreamSeed = 0
    stream_shuffle_buffer: StreamShuffleBuffer = STREAM_SHUFFLE_BUFFER
    strip_strings: tuple[str, ...] = ()
    """Literal strings removed from every string column of each row (after ``fields``), e.g. a
    tokenizer's control token written into the data (``<|endoftext|>``)."""
    truncation_side: TruncationSide = "right"
    lm_eval_task: LmEvalTask = None
    lm_eval_include_path: LmEvalIncludePath = None
    lm_eval_metric: LmEvalMetric = "acc"
    lm_eval_num_fewshot: LmEvalNumFewshot = None
    lm_eval_system_instruction: LmEvalSystemInstruction = None
    lm_eval_apply_chat_template: LmEvalApplyChatTemplate = False
    lm_eval_fewshot_as_multiturn: LmEvalFewshotAsMultiturn = True
    origin: str | None = field(default=None, compare=False, repr=False)
    """How messages name where the rows come from, when none of ``path``/``hub_id``/``rows``
    says it (``tokenize_rows`` leaves the in-memory rows out of its cache key but keeps
    their description)."""

    def _check_no_lm_eval_settings(self) -> None:
        """``lm_eval_*`` settings configure an lm-eval task; without one they are a mistake."""
        defaults = {
            "lm_eval_include_path": None,
            "lm_eval_metric": "acc",
            "lm_eval_num_fewshot": None,
            "lm_eval_system_instruction": None,
            "lm_eval_apply_chat_template": False,
            "lm_eval_fewshot_as_multiturn": True,
        }
        given = [name for name, default in defaults.items() if getattr(self, name) != default]
        if given:
            raise DataError(f"{', '.join(given)} configure lm_eval_task; set lm_eval_task= too")

    def __post_init__(self) -> None:
        given = [
            name
            for name in ("path", "hub_id", "rows", "lm_eval_task")
            if getattr(self, name) is not None
        ]
        if len(given) > 1:
            raise DataError(
                "a DataSource reads one of path= (a local file or folder), hub_id= (a hub "
                "dataset id), rows= (a datasets.Dataset) or lm_eval_task= (an lm-eval "
                f"task); got {' and '.join(given)}"
            )
        if self.lm_eval_task is not None and self.format != LM_EVAL_CHOICES.name:
            raise DataError(
                f"lm_eval_task={self.lm_eval_task!r} reads a multiple-choice task: "
                f"set format={LM_EVAL_CHOICES.name!r}"
            )
        if self.lm_eval_task is None:
            self._check_no_lm_eval_settings()
        if self.rows is not None and not isinstance(self.rows, datasets.Dataset):
            raise DataError(f"rows= must be a datasets.Dataset, got {type(self.rows).__name__}")
        if self.format not in FORMATS:
            raise DataError(f"format={self.format!r}: use one of {', '.join(FORMATS)}")
        if self.budget is not None and (
            isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 1
        ):
            raise DataError(
                f"budget={self.budget!r}: use a positive row count, or None for all rows"
            )
        row_format = FORMATS[self.format]
        if self.metric is None:
            object.__setattr__(self, "metric", row_format.metrics[0])
        if self.metric not in ("accuracy", "loss"):
            raise DataError(
                f"metric={self.metric!r}: a multiple-choice source uses 'accuracy' or 'loss'"
            )
        if self.metric not in row_format.metrics:
            raise DataError(
                f"metric={self.metric!r} needs format={_formats_with(self.metric)} (got "
                f"{self.format!r}); a {self.format} source is scored by metric="
                f"{' or '.join(repr(metric) for metric in row_format.metrics)}"
            )
        if self.lm_eval_metric not in ("acc", "acc_norm"):
            raise DataError(f"lm_eval_metric={self.lm_eval_metric!r}: use 'acc' or 'acc_norm'")
        if self.lm_eval_metric != "acc" and self.metric == "loss":
            raise DataError(
                f"lm_eval_metric={self.lm_eval_metric!r} picks what metric='accuracy' "
                "scores; metric='loss' is the correct continuation's loss: remove "
                "lm_eval_metric or set metric='accuracy'"
            )
        if self.stream_rows is not None and (
            isinstance(self.stream_rows, bool)
            or not isinstance(self.stream_rows, int)
            or self.stream_rows < 1
        ):
            raise DataError(
                f"stream_rows={self.stream_rows!r}: use a positive row "
                "count, or None to read every row"
            )
        if self.stream_rows is not None and self.rows is not None:
            raise DataError(
                "stream_rows reads a file or hub split as a stream; rows= are already in memory"
            )
        if (
            isinstance(self.stream_seed, bool)
            or not isinstance(self.stream_seed, int)
            or self.stream_seed < 0
        ):
            raise DataError(f"stream_seed={self.stream_seed!r}: use a seed >= 0")
        if (
            isinstance(self.stream_shuffle_buffer, bool)
            or not isinstance(self.stream_shuffle_buffer, int)
            or self.stream_shuffle_buffer < 0
        ):
            raise DataError(
                f"stream_shuffle_buffer={self.stream_shuffle_buffer!r}: use a row count >= 0 (0 "
                "keeps the stream's first rows)"
            )
        if self.loss_on not in LOSS_ON:
            raise DataError(f"loss_on={self.loss_on!r}: use one of {', '.join(LOSS_ON)}")
        if not isinstance(self.strip_strings, tuple) or not all(
            isinstance(s, str) and s for s in self.strip_strings
        ):
            raise DataError(
                f"strip_strings={self.strip_strings!r}: give a tuple of non-empty strings"
            )
        if self.revision is not None and (
            not isinstance(self.revision, str) or not self.revision.strip()
        ):
            raise DataError(
                f"revision={self.revision!r}: give a branch, tag or commit of the hub dataset"
            )
        if self.revision is not None and self.hub_id is None:
            raise DataError(
                f"revision={self.revision!r} pins a hub dataset's version; it needs hub_id= (a "
                "local path or rows in memory have no revision)"
            )
        if self.data_files is not None:
            check_data_files(self.data_files)
            if self.hub_id is None and (self.path is None or Path(self.path).suffix):
                raise DataError(
                    f"data_files={self.data_files!r} chooses files of a hub dataset or "
                    "of a local folder; it needs hub_id= or a folder path= (a single "
                    "local file is read as it is)"
                )
        for name, spec in self.fields.items():
            _check_field_spec(name, spec)
        self._check_chat_template()
        if self.truncation_side not in ("right", "left"):
            raise DataError(f"truncation_side={self.truncation_side!r}: use 'right' or 'left'")
        _check_split_size("eval_size", self.eval_size)
        _check_split_size("test_size", self.test_size)
        if (
            isinstance(self.eval_size, float)
            and isinstance(self.test_size, float)
            and self.eval_size + self.test_size > 1.0
        ):
            raise DataError(
                f"eval_size + test_size = {self.eval_size + self.test_size} > 1: the held-out "
                "fractions cannot take more than every row"
            )

    def _check_chat_template(self) -> None:
        if self.chat_template_path is not None and (
            not isinstance(self.chat_template_path, str) or not self.chat_template_path.strip()
        ):
            raise DataError(
                f"chat_template_path={self.chat_template_path!r}: give the path of a Jinja file"
            )
        if not isinstance(self.chat_template_kwargs, Mapping) or not all(
            isinstance(key, str) for key in self.chat_template_kwargs
        ):
            raise DataError(
                f"chat_template_kwargs={self.chat_template_kwargs!r}: give a mapping of template "
                "variable names to values, e.g. {'enable_thinking': False}"
            )
        reserved = sorted(set(self.chat_template_kwargs) & CHAT_TEMPLATE_ARGUMENTS)
        if reserved:
            raise DataError(
                f"chat_template_kwargs sets {', '.join(reserved)}, which the formatting of the "
                "rows sets itself; remove them (tools come from the rows' tools column, the "
                "template from chat_template_path)"
            )
        given = [
            name for name in ("chat_template_path", "chat_template_kwargs") if getattr(self, name)
        ]
        if given and not FORMATS[self.format].renders_chats:
            chats = " or ".join(
                f"format={name!r}" for name, f in FORMATS.items() if f.renders_chats
            )
            raise DataError(
                f"{' and '.join(given)} render rows through the chat template; this dataset's "
                f"format is {self.format!r}: remove {' and '.join(given)} or use {chats}"
            )

    @property
    def description(self) -> str:
        """How error messages name this dataset."""
        if self.path is not None:
            where = f"file {self.path}" if Path(self.path).suffix else f"folder {self.path}"
        elif self.lm_eval_task is not None:
            where = f"lm-eval task {self.lm_eval_task}"
        elif self.hub_id is None:
            if self.rows is not None:
                where = "rows in memory"
            else:
                where = self.origin if self.origin is not None else "no path, hub_id or rows"
        else:
            config = f" (config {self.config_name})" if self.config_name else ""
            where = f"hub dataset {self.hub_id}{config}, split {self.split}"
        return where if self.name is None else f"dataset {self.name!r} ({where})"

    def response_key(self, columns: list[str] | Any) -> str:
        """The column of a pair's response: ``response_column``, or TRL's ``completion_column``
        when the rows have it and not the response column."""
        if self.response_column not in columns and self.completion_column in columns:
            return self.completion_column
        return self.response_column


def _formats_with(metric: str) -> str:
    """The formats scored by ``metric``, as a message names them: 'multiple_choice'."""
    return " or ".join(repr(name) for name, f in FORMATS.items() if metric in f.metrics)


def check_data_files(value: object) -> None:
    def paths(item: object) -> bool:
        return (isinstance(item, str) and bool(item.strip())) or (
            isinstance(item, list)
            and bool(item)
            and all(isinstance(p, str) and p.strip() for p in item)
        )

    if isinstance(value, dict):
        good = bool(value) and all(isinstance(k, str) and k and paths(v) for k, v in value.items())
    else:
        good = paths(value)
    if not good:
        raise DataError(
            f"data_files={value!r}: give a file path or glob ('data.jsonl'), a non-empty list of "
            "them, or a mapping of split names to them ({'train': 'data.jsonl'})"
        )


def _check_field_spec(name: str, spec: object) -> None:
    if not isinstance(spec, str | list) or (
        isinstance(spec, list) and not all(isinstance(p, str) for p in spec)
    ):
        raise DataError(
            f"fields.{name}: give a template string ('{{question}}\n{{context}}'), a column path "
            f"('mc1_targets.choices') or a list of column paths, not {spec!r}"
        )
    if isinstance(spec, str) and "{" in spec:
        try:
            list(string.Formatter().parse(spec))
        except ValueError as err:
            raise DataError(
                f"fields.{name}: template {spec!r} is not a valid format string ({err})"
            ) from None
