"""Where a dataset's rows come from: the ``DataSource`` spec and ``load_rows``.

Public API:

- ``DataSource``: frozen spec of one dataset: a local file or folder (``path``) or a hub
  id (``hub_id`` + optional ``config_name``), the split to read, the row ``format``
  (``"text"``, ``"instruction"`` or ``"multiple_choice"``), the column names, the sample
  ``budget`` and the sizes of the held-out ``eval`` and ``test`` splits.
- ``load_rows(source, cache_dir=None) -> datasets.Dataset``: read the rows with
  ``datasets.load_dataset`` and check that the columns the format needs are there.
- ``check_columns(rows, source)``: that check alone (also run by ``build_examples``).
- ``derive_fields(rows, source)``: the columns ``source.fields`` builds from each row (a
  prompt template over several columns, a nested value, a list of columns), added with
  ``Dataset.map``; ``load_rows`` applies it, and drops the rows ``source.drop_empty`` names.
- ``check_path(source)``: that a local source exists, has a known extension and is not an
  empty file, without reading it (a run checks every dataset this way before loading the model).
- ``read_chat_template(source)``: the text of ``source.chat_template_path`` (``check_path``
  checks it too).
- ``offline()``: whether the Hugging Face libraries are told not to use the network.
- ``SourcePath``, ``HubId``, ... ``LmEvalIncludePath``: the annotated types of the fields
  ``DataSource`` shares with a run config's ``datasets:`` entry, each holding the field's
  description and the constraints the config validates (pydantic ``Field`` metadata, which
  the ``DataSource`` dataclass ignores: it checks its values itself).
- ``DataError``: every data problem, on one line; the message names the dataset (its
  ``name`` in a run config, and the file or hub id), the field or column, and the fix.
  Errors of ``load_dataset`` (a hub id that cannot be found, offline or not; an unknown
  split; a malformed file) become ``DataError`` too, and so does a file without rows.

All parsing is done by the ``datasets`` library: local ``.jsonl``/``.json`` files through
its ``"json"`` builder, ``.parquet`` through ``"parquet"`` and ``.txt`` through ``"text"``
(one row per line, in a ``text`` column). A local folder or a hub id goes to
``load_dataset`` as its ``path`` argument, so anything ``load_dataset`` reads works there.
A hub id can be pinned to a ``revision`` (a branch, tag or commit) and read from chosen
``data_files`` (a repository holding files of several formats and no ``configs`` block,
such as a ``.csv`` next to a ``.jsonl``); both go to ``load_dataset`` as they are.
Huge corpora used as unlimited datasets are read as a stream: ``stream_rows=N`` opens the
split with ``load_dataset(..., streaming=True)``, shuffles it with ``IterableDataset.shuffle``
(``stream_seed``, a buffer of ``stream_shuffle_buffer`` rows, and the order of the shards)
and keeps N rows, so the corpus is never downloaded whole (a sliced split such as
``"train[:20000]"`` would download every file of the split first) and the rows are not
merely the corpus's first ones (the first articles of a dump, the first documents of a
crawl). Those rows are written once to ``datasets``' cache (``Dataset.from_generator``),
keyed by the source (a local path resolved to an absolute one), the seed and buffer, the
size and modification time of every local file read (each file of a folder), the hub
revision when one is given, and ``LOADING_VERSION``, a hash of this module's source, so that a
change of the reading code reads the stream again: later runs read them from disk.
``strip_strings`` removes literal strings (a tokenizer's control token written into the
data, such as Glaive's ``<|endoftext|>``) from every string column. Every row loaded is
tokenized once, up front.
"""

from __future__ import annotations

import hashlib
import os
import re
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import datasets
from datasets import load_dataset
from huggingface_hub import constants as hub_constants
from pydantic import BeforeValidator, Field

RowFormat = Literal["text", "instruction", "multiple_choice"]
ROW_FORMATS: tuple[str, ...] = ("text", "instruction", "multiple_choice")
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

# File extension -> the ``datasets`` builder that reads it.
LOCAL_BUILDERS: dict[str, str] = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".txt": "text",
}


class DataError(ValueError):
    """A dataset that cannot be read or formatted; the message says what to change."""


LOADING_VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
"""A hash of this module's source: part of the cache key of the streamed rows and of the
``fields`` columns, since ``datasets`` fingerprints a module-level function by its name only
(editing the code would otherwise read the old cached rows)."""


_TRUE = ("1", "true", "yes", "y", "on", "t")


def offline() -> bool:
    """Whether the Hugging Face libraries are told not to use the network."""
    variables = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    return bool(hub_constants.HF_HUB_OFFLINE) or any(
        os.environ.get(name, "").strip().lower() in _TRUE for name in variables
    )


def one_line(text: object, limit: int = 300) -> str:
    """``text`` with its whitespace collapsed onto one line, cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


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
        description="Hub dataset revision to read (a branch, tag or commit; datasets.load_dataset's revision); "
        "needs hub_id.",
    ),
]
DataFilesField = Annotated[
    DataFiles | None,
    BeforeValidator(_data_files_shape),
    Field(
        description="Files of the hub dataset (or local folder) to read, datasets.load_dataset's data_files: a path "
        "or glob, a list of them, or split -> path(s); e.g. the .jsonl of a repository that also holds a .csv "
        "and declares no configs.",
    ),
]
Split = Annotated[str, Field(description="Split to read; slices work, e.g. 'train[:20000]'.")]
Format = Annotated[
    RowFormat,
    Field(
        description="Row format: plain text, prompt/response pairs (or messages, or TRL's prompt/completion: "
        "strings or message lists), or multiple choice.",
    ),
]
LossOnField = Annotated[
    LossOn,
    Field(
        description="Instruction rows: the loss on the response only (the last assistant message, or a "
        "prompt/completion pair's completion; TRL's completion_only_loss), or on every assistant turn (of the "
        "completion, for a pair; TRL's assistant_only_loss).",
    ),
]
Budget = Annotated[
    int | None,
    Field(ge=1, description="Training rows to use (null: all, e.g. an unlimited corpus)."),
]
Fields = Annotated[
    dict[str, FieldSpec],
    Field(
        description="Columns built from each row before formatting, by name: a template over columns "
        "('{document}\\n\\nQuestion: {question}'), a nested column path ('mc1_targets.choices') or a "
        "list of column paths (choices spread over several columns).",
    ),
]
TruncationSide = Annotated[
    Literal["right", "left"],
    Field(
        description="Which end of a too-long example is cut: left keeps the response and the end of "
        "a long prompt (a document before a question), right keeps the start.",
    ),
]
ChatTemplatePath = Annotated[
    str | None,
    Field(
        min_length=1,
        description="Instruction rows: a Jinja file rendering them instead of the tokenizer's chat template (as TRL's "
        "chat_template_path), e.g. one with {% generation %} blocks for loss_on all-assistant; relative paths are "
        "read from the working directory.",
    ),
]
ChatTemplateKwargs = Annotated[
    dict[str, Any],
    Field(
        description="Instruction rows: variables passed to the chat template (apply_chat_template's keyword "
        "arguments), e.g. {enable_thinking: false} for Qwen3.",
    ),
]
StreamRows = Annotated[
    int | None,
    Field(
        ge=1,
        description="Read the split as a stream (datasets streaming) and keep this many rows, shuffled "
        "first (stream_seed, stream_shuffle_buffer), cached on disk after the first read: for huge corpora, "
        "never downloaded whole.",
    ),
]
StreamSeed = Annotated[
    int, Field(ge=0, description="Seed of the shuffle of a stream before its rows are kept.")
]
StreamShuffleBuffer = Annotated[
    int,
    Field(
        ge=0,
        description="Rows of the buffer a stream is shuffled through (IterableDataset.shuffle; the shards' "
        "order is shuffled too); 0 keeps the stream's first rows.",
    ),
]
ShuffleChoices = Annotated[
    bool,
    Field(
        description="Multiple choice: shuffle each question's choices in an order seeded by the question "
        "(the same on every run), for a benchmark whose correct choice is always at one index.",
    ),
]
LmEvalTask = Annotated[
    str | None,
    Field(
        min_length=1,
        description="An lm-evaluation-harness multiple-choice task (e.g. tinyMMLU), or a group of them pooled "
        "into one dataset, whose documents are the rows, built by the task's own prompts, choices, answers, "
        "few-shot setting and split (instead of path or hub_id; needs the extra lm-eval). metric accuracy is "
        "lm-eval's acc or acc_norm (lm_eval_metric; constraints only), loss the loss of the correct choice's "
        "continuation (any role). docs/lm-eval.md.",
    ),
]
LmEvalIncludePath = Annotated[
    str | None,
    Field(
        min_length=1,
        description="A folder of lm-eval task YAMLs searched for lm_eval_task (a task over local files).",
    ),
]
LmEvalMetric = Annotated[
    Literal["acc", "acc_norm"],
    Field(
        description="Which of lm-eval's multiple-choice metrics metric accuracy is: acc (the choice whose "
        "continuation has the largest summed log-likelihood) or acc_norm (that sum divided by the choice's "
        "length in characters, e.g. tinyMMLU, tinyHellaswag); the task must report it. docs/lm-eval.md.",
    ),
]
LmEvalNumFewshot = Annotated[
    int | None,
    Field(
        ge=0,
        description="Few-shot examples before each document, as lm_eval --num_fewshot (a task whose config sets "
        "num_fewshot: 0 keeps 0); default: the task's own.",
    ),
]
LmEvalApplyChatTemplate = Annotated[
    bool,
    Field(
        description="lm_eval --apply_chat_template: each context (system instruction, few-shot examples, "
        "document) is put through the tokenizer's chat template, as lm-eval's hf model renders it.",
    ),
]
LmEvalFewshotAsMultiturn = Annotated[
    bool,
    Field(
        description="lm_eval --fewshot_as_multiturn, with lm_eval_apply_chat_template: the few-shot examples as "
        "turns of the chat (true, simple_evaluate's default) or all in the first user turn (false).",
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

    name: str | None = None
    """The dataset's name in a run config; error messages lead with it."""
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
    """How the domain is scored. ``multiple_choice``: ``accuracy`` scores the
    letter-restricted argmax, ``loss`` is the loss of the correct choice's text after the
    question (see ``formatting``). Other formats are scored by ``loss`` only. None (the
    default) becomes ``accuracy`` for ``multiple_choice`` and ``loss`` otherwise."""
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
                f"a DataSource reads one of path= (a local file or folder), hub_id= (a hub dataset id), "
                f"rows= (a datasets.Dataset) or lm_eval_task= (an lm-eval task); got {' and '.join(given)}"
            )
        if self.lm_eval_task is not None and self.format != "multiple_choice":
            raise DataError(
                f"lm_eval_task={self.lm_eval_task!r} reads a multiple-choice task: set format='multiple_choice'"
            )
        if self.lm_eval_task is None:
            self._check_no_lm_eval_settings()
        if self.rows is not None and not isinstance(self.rows, datasets.Dataset):
            raise DataError(f"rows= must be a datasets.Dataset, got {type(self.rows).__name__}")
        if self.format not in ROW_FORMATS:
            raise DataError(f"format={self.format!r}: use one of {', '.join(ROW_FORMATS)}")
        if self.budget is not None and (
            isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 1
        ):
            raise DataError(
                f"budget={self.budget!r}: use a positive row count, or None for all rows"
            )
        if self.metric is None:
            object.__setattr__(
                self, "metric", "accuracy" if self.format == "multiple_choice" else "loss"
            )
        if self.metric not in ("accuracy", "loss"):
            raise DataError(
                f"metric={self.metric!r}: a multiple-choice source uses 'accuracy' or 'loss'"
            )
        if self.metric == "accuracy" and self.format != "multiple_choice":
            raise DataError(
                f"metric='accuracy' needs format='multiple_choice' (got {self.format!r}); a "
                f"{self.format} source is scored by metric='loss'"
            )
        if self.lm_eval_metric not in ("acc", "acc_norm"):
            raise DataError(f"lm_eval_metric={self.lm_eval_metric!r}: use 'acc' or 'acc_norm'")
        if self.lm_eval_metric != "acc" and self.metric == "loss":
            raise DataError(
                f"lm_eval_metric={self.lm_eval_metric!r} picks what metric='accuracy' scores; metric='loss' is the "
                "correct continuation's loss: remove lm_eval_metric or set metric='accuracy'"
            )
        if self.stream_rows is not None and (
            isinstance(self.stream_rows, bool)
            or not isinstance(self.stream_rows, int)
            or self.stream_rows < 1
        ):
            raise DataError(
                f"stream_rows={self.stream_rows!r}: use a positive row count, or None to read every row"
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
                f"stream_shuffle_buffer={self.stream_shuffle_buffer!r}: use a row count >= 0 (0 keeps the "
                "stream's first rows)"
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
                f"revision={self.revision!r} pins a hub dataset's version; it needs hub_id= (a local path or "
                "rows in memory have no revision)"
            )
        if self.data_files is not None:
            check_data_files(self.data_files)
            if self.hub_id is None and (self.path is None or Path(self.path).suffix):
                raise DataError(
                    f"data_files={self.data_files!r} chooses files of a hub dataset or of a local folder; it needs "
                    "hub_id= or a folder path= (a single local file is read as it is)"
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
                f"chat_template_kwargs={self.chat_template_kwargs!r}: give a mapping of template variable names "
                "to values, e.g. {'enable_thinking': False}"
            )
        reserved = sorted(set(self.chat_template_kwargs) & CHAT_TEMPLATE_ARGUMENTS)
        if reserved:
            raise DataError(
                f"chat_template_kwargs sets {', '.join(reserved)}, which the formatting of the rows sets itself; "
                "remove them (tools come from the rows' tools column, the template from chat_template_path)"
            )
        given = [
            name for name in ("chat_template_path", "chat_template_kwargs") if getattr(self, name)
        ]
        if given and self.format != "instruction":
            raise DataError(
                f"{' and '.join(given)} render instruction rows through the chat template; this dataset's format is "
                f"{self.format!r}: remove {' and '.join(given)} or use format='instruction'"
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

    def required_columns(self, columns: list[str]) -> list[str]:
        """The columns this format needs, given the columns the rows actually have (an
        instruction dataset reads ``messages_column`` when present, else the pair)."""
        if self.lm_eval_task is not None:
            return ["contexts", "continuations", "answer"]  # what lm_eval_tasks.task_rows builds
        if self.format == "text":
            return [self.text_column]
        if self.format == "instruction":
            if self.messages_column in columns:
                # A system prompt is read from its own column next to the chat list too.
                return [self.messages_column] + (
                    [] if self.system_column is None else [self.system_column]
                )
            pair = [self.prompt_column, self.response_key(columns)]
            return pair if self.system_column is None else [*pair, self.system_column]
        return [self.question_column, self.choices_column, self.answer_column]

    def response_key(self, columns: list[str] | Any) -> str:
        """The column of a pair's response: ``response_column``, or TRL's ``completion_column``
        when the rows have it and not the response column."""
        if self.response_column not in columns and self.completion_column in columns:
            return self.completion_column
        return self.response_column


def check_columns(rows: datasets.Dataset, source: DataSource) -> None:
    """Raise ``DataError`` naming the missing column, the columns there are and the fix."""
    columns = list(rows.column_names)
    missing = [c for c in source.required_columns(columns) if c not in columns]
    if not missing:
        return
    fix = {
        "text": "set text_column",
        "instruction": (
            f"give the rows a {source.messages_column!r} chat list, or set messages_column, "
            "or prompt_column/response_column (and system_column) to the pair's columns (TRL's "
            "prompt/completion columns are read as they are)"
        ),
        "multiple_choice": "set question_column/choices_column/answer_column",
    }[source.format]
    if source.name is not None:
        # A run config names the columns in a `columns` mapping.
        fix = re.sub(r"(\w+)_column", r"columns.\1", fix) + " in the dataset's config"
    raise DataError(
        f"{source.description}: {'an' if source.format == 'instruction' else 'a'} {source.format} "
        "dataset needs column(s) "
        f"{', '.join(repr(c) for c in missing)}, but its columns are {columns}; {fix}"
    )


def load_rows(
    source: DataSource, cache_dir: str | os.PathLike[str] | None = None
) -> datasets.Dataset:
    """Read the rows of ``source`` with ``datasets.load_dataset`` and check its columns.

    ``cache_dir`` is where ``datasets`` keeps its Arrow cache (its default when None).
    """
    cache = None if cache_dir is None else str(cache_dir)
    check_path(source)
    if source.lm_eval_task is not None:
        from dynamics.data.lm_eval_tasks import task_rows

        return task_rows(source)
    if source.rows is not None:
        loaded = source.rows
    elif source.path is None and source.hub_id is None:
        raise DataError(
            f"{source.description}: no rows to read; give path= (a local file or folder), hub_id= (a hub "
            "dataset id) or rows= (a datasets.Dataset)"
        )
    elif source.path is not None:
        path = Path(source.path)
        if path.is_dir():
            loaded = _load(
                source, str(path), name=source.config_name, cache_dir=cache, **_file_options(source)
            )
        else:
            builder = LOCAL_BUILDERS[path.suffix.lower()]
            if builder in ("json", "text") and _blank(path):
                raise _empty(source)
            loaded = _load(source, builder, data_files=str(path), cache_dir=cache)
    else:
        loaded = _load(
            source, source.hub_id, name=source.config_name, cache_dir=cache, **_file_options(source)
        )
    if not isinstance(loaded, datasets.Dataset):
        raise DataError(
            f"{source.description}: load_dataset returned a {type(loaded).__name__}, not one "
            f"split; set split= to one split (e.g. 'train')"
        )
    if len(loaded) == 0:
        raise _empty(source)
    loaded = derive_fields(loaded, source)
    if source.strip_strings:
        loaded = strip_strings(loaded, source)
    if source.drop_empty:
        loaded = _drop_empty(loaded, source)
    check_columns(loaded, source)
    return loaded


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
            f"data_files={value!r}: give a file path or glob ('data.jsonl'), a non-empty list of them, or a "
            "mapping of split names to them ({'train': 'data.jsonl'})"
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


def _path_value(row: Mapping[str, Any], path: str) -> Any:
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(path)
        value = value[part]
    return value


def _field_value(row: Mapping[str, Any], spec: FieldSpec) -> Any:
    if isinstance(spec, list):
        return [_path_value(row, path) for path in spec]
    if "{" in spec:
        formatter = string.Formatter()
        for _, name, _, _ in formatter.parse(spec):
            if name is not None and formatter.get_field(name, (), row)[0] is None:
                raise _NullField(name)
        return spec.format_map(row)
    return _path_value(row, spec)


class _NullField(Exception):
    """A template placeholder whose value is null in a row (it would render as "None")."""


def _build_fields(
    row: dict[str, Any], index: int, specs: dict[str, FieldSpec], description: str, version: str
) -> dict[str, Any]:
    """``Dataset.map`` function of ``derive_fields`` (``version`` only keys its cache)."""
    built = {}
    for name, spec in specs.items():
        try:
            built[name] = _field_value(row, spec)
        except _NullField as err:
            raise DataError(
                f"{description}, row {index}: fields.{name} = {spec!r} reads {{{err}}}, which is null in this "
                "row; fill it, or build the field from other columns"
            ) from None
        except (KeyError, IndexError, AttributeError, TypeError) as err:
            raise DataError(
                f"{description}, row {index}: fields.{name} = {spec!r} reads {err}, which this row does not "
                "have; fix the row, or the template or path"
            ) from None
    return built


def derive_fields(rows: datasets.Dataset, source: DataSource) -> datasets.Dataset:
    """``rows`` with the columns of ``source.fields`` added (``Dataset.map``); a template or
    path naming a column the rows lack raises ``DataError`` with the columns there are, and
    one naming a value missing or null in some row raises ``DataError`` naming the row (a
    template never renders a null as ``"None"``)."""
    if not source.fields:
        return rows
    specs = dict(source.fields)
    first = rows[0]
    for name, spec in specs.items():
        try:
            _field_value(first, spec)
        except _NullField:
            pass  # a null value of row 0 is reported with its row by the map below
        except (KeyError, IndexError, AttributeError, TypeError) as err:
            raise DataError(
                f"{source.description}: fields.{name} = {spec!r} reads {err}, which row 0 does not have; its "
                f"columns are {list(rows.column_names)}: fix the template or path"
            ) from None

    return rows.map(
        _build_fields,
        with_indices=True,
        fn_kwargs={"specs": specs, "description": source.description, "version": LOADING_VERSION},
        desc="fields",
    )


def _file_options(source: DataSource) -> dict[str, Any]:
    """``load_dataset``'s ``revision`` and ``data_files`` where the source sets them."""
    options: dict[str, Any] = {}
    if source.revision is not None:
        options["revision"] = source.revision
    if source.data_files is not None:
        options["data_files"] = source.data_files
    return options


def _strip_row(row: dict[str, Any], strings: tuple[str, ...], version: str) -> dict[str, Any]:
    """``Dataset.map`` function of ``strip_strings`` (``version`` only keys its cache)."""
    stripped = {}
    for key, value in row.items():
        if isinstance(value, str):
            for text in strings:
                value = value.replace(text, "")
            stripped[key] = value
    return stripped


def strip_strings(rows: datasets.Dataset, source: DataSource) -> datasets.Dataset:
    """``rows`` with every ``source.strip_strings`` removed from each string column."""
    return rows.map(
        _strip_row,
        fn_kwargs={"strings": tuple(source.strip_strings), "version": LOADING_VERSION},
        desc="strip_strings",
    )


def _drop_empty(rows: datasets.Dataset, source: DataSource) -> datasets.Dataset:
    missing = [c for c in source.drop_empty if c not in rows.column_names]
    if missing:
        raise DataError(
            f"{source.description}: drop_empty names columns {missing} that the rows lack; its columns "
            f"are {list(rows.column_names)}"
        )
    columns = list(source.drop_empty)
    kept = rows.filter(
        lambda row: all(row[c] not in (None, "", []) for c in columns), desc="drop_empty"
    )
    if len(kept) == 0:
        raise DataError(
            f"{source.description}: every row has an empty {' or '.join(columns)}; check drop_empty"
        )
    return kept


def _first_rows(
    path: str | None,
    split: str,
    rows: int,
    options: dict[str, Any],
    stamp: dict[str, Any],
    seed: int = 0,
    buffer_size: int = STREAM_SHUFFLE_BUFFER,
) -> Iterator[dict[str, Any]]:
    """``rows`` rows of a split read with ``load_dataset(..., streaming=True)``, shuffled with
    ``IterableDataset.shuffle(seed, buffer_size)`` first (the stream's first rows when
    ``buffer_size`` is 0), for ``Dataset.from_generator`` (``stamp`` only keys its cache)."""
    stream = load_dataset(path, split=split, streaming=True, **options)
    if buffer_size > 0:
        stream = stream.shuffle(seed=seed, buffer_size=buffer_size)
    yield from stream.take(rows)


def _stream_stamp(source: DataSource, options: Mapping[str, Any]) -> dict[str, Any]:
    """What the cached first rows of a stream depend on besides the arguments of the read:
    the local path made absolute, the size and time of every local file read (each file of
    a folder, hidden ones aside), the hub revision, and the reading code."""
    stamp: dict[str, Any] = {"version": LOADING_VERSION, "revision": options.get("revision")}
    if source.path is not None:
        root = Path(source.path).resolve()
        if root.is_dir():
            files = sorted(
                p
                for p in root.rglob("*")
                if p.is_file()
                and not any(part.startswith(".") for part in p.relative_to(root).parts)
            )
        else:
            files = [root]
        stamp["path"] = str(root)
        stamp["files"] = [
            (
                p.relative_to(root).as_posix() if root.is_dir() else p.name,
                p.stat().st_size,
                p.stat().st_mtime_ns,
            )
            for p in files
        ]
    return stamp


def read_chat_template(source: DataSource) -> str:
    """The text of ``source.chat_template_path``; ``DataError`` when it is not a readable,
    non-empty text file."""
    path = Path(source.chat_template_path or "")
    where = f"{source.description}: chat_template_path {str(path)!r}"
    if not path.is_file():
        raise DataError(
            f"{where} is not a file; give the path of a Jinja chat template (relative paths are read from the "
            f"working directory {Path.cwd()})"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{where} cannot be read as UTF-8 text: {one_line(err)}") from None
    if not text.strip():
        raise DataError(f"{where} is empty; give a Jinja chat template")
    return text


def check_path(source: DataSource) -> None:
    """Raise ``DataError`` when a local source (or its ``chat_template_path``) is missing,
    has an unknown extension or is an empty file; hub ids pass (they are looked up only
    when loaded)."""
    if source.chat_template_path is not None:
        read_chat_template(source)
    if source.path is None:
        return
    path = Path(source.path)
    if not path.exists():
        raise DataError(
            f"{source.description} does not exist; check the path (relative paths are "
            f"read from the working directory {Path.cwd()})"
        )
    if path.is_dir():
        return
    if path.suffix.lower() not in LOCAL_BUILDERS:
        raise DataError(
            f"{source.description}: unknown extension {path.suffix!r}; use one of "
            f"{', '.join(LOCAL_BUILDERS)} (or convert the file to JSON lines)"
        )
    if path.stat().st_size == 0:
        raise _empty(source)


def _empty(source: DataSource) -> DataError:
    return DataError(
        f"{source.description} is empty: it has no rows (split {source.split}); fill it or remove it"
    )


def _blank(path: Path, limit: int = 1 << 20) -> bool:
    """A small text file holding only whitespace (``datasets`` fails obscurely on one)."""
    if path.stat().st_size > limit:
        return False
    return not path.read_bytes().strip()


def _load(source: DataSource, path: str | None, **kwargs: object) -> object:
    """``load_dataset(path, split=source.split, **kwargs)`` with its errors as one-line
    ``DataError``s that name the dataset and the fix."""
    try:
        if source.stream_rows is None:
            return load_dataset(path, split=source.split, **kwargs)
        # The first rows of the stream are written once to datasets' cache, keyed by where
        # they come from (and a local file's size and time), so a later run, or another
        # process of this machine, reads them from disk instead of streaming them again.
        options = {key: value for key, value in kwargs.items() if key != "cache_dir"}
        stamp = _stream_stamp(source, options)
        if source.path is not None and Path(source.path).is_dir():
            path = stamp["path"]  # the same folder, named relatively or not, is one cache entry
        elif source.path is not None:
            options["data_files"] = stamp["path"]
        return datasets.Dataset.from_generator(
            _first_rows,
            gen_kwargs={
                "path": path,
                "split": source.split,
                "rows": source.stream_rows,
                "options": options,
                "stamp": stamp,
                "seed": source.stream_seed,
                "buffer_size": source.stream_shuffle_buffer,
            },
            cache_dir=kwargs.get("cache_dir"),
        )
    except StopIteration:  # what the json builder raises on a file without rows
        raise _empty(source) from None
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as err:
        cause = err.__cause__ or err.__context__
        detail = one_line(err)
        if isinstance(err, datasets.exceptions.DatasetGenerationError) and cause is not None:
            detail = one_line(cause)  # the builder's own error, e.g. the JSON parse error
        if "corresponds to no data" in detail:
            raise _empty(source) from None
        value_error = isinstance(err, ValueError) or isinstance(
            cause, ValueError
        )  # a stream's is its cause
        if value_error and ("split" in detail or "instruction format" in detail):
            raise DataError(
                f"{source.description}: split {source.split!r} cannot be read ({detail}); set split "
                "to one of the dataset's splits (a single local file is 'train'), e.g. 'train[:1000]'"
            ) from None
        if source.hub_id is not None and isinstance(
            err, OSError | datasets.exceptions.DatasetsError
        ):
            if offline():
                why = (
                    "it is not in the local cache and the hub is offline (HF_HUB_OFFLINE or "
                    "HF_DATASETS_OFFLINE is set): check hub_id and config_name, download it once "
                    "online, or use a local path"
                )
            else:
                why = (
                    "check hub_id and config_name (and that you may access it), or use a local path"
                )
            raise DataError(
                f"{source.description} could not be found or loaded: {why} ({detail})"
            ) from None
        raise DataError(f"{source.description} could not be read: {detail}") from None
