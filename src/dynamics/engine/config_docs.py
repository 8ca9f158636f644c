"""docs/config.md, generated from the run config's field descriptions (a test keeps them
equal): ``python -c 'from dynamics.engine.config_docs import config_reference_markdown as m;
open("docs/config.md", "w").write(m())'``."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from dynamics.engine.config import (
    EvaluationConfig,
    LoraConfig,
    ModelConfig,
    OptimizerConfig,
    RunConfig,
    TrainingConfig,
)
from dynamics.engine.dataset_config import DatasetConfig
from dynamics.engine.method_config import FloorsConfig, GridConfig, MethodConfig

PROSE_WIDTH = 100
"""Columns of a prose line in docs/*.md (tests/test_docs_width.py checks the hand-written ones)."""
_WORD = re.compile(r"(?:`[^`]*`|[^\s`])+")
"""What a line never breaks inside: a run of characters without spaces, code spans included."""


def config_reference_markdown() -> str:
    """docs/config.md, generated from the field descriptions (a test keeps them equal)."""
    sections: list[tuple[str, type[BaseModel], str]] = [
        ("model", ModelConfig, "The base model."),
        ("lora", LoraConfig, "LoRA adapter; `lora: null` means full fine-tuning."),
        ("optimizer", OptimizerConfig, "AdamW and its learning-rate schedule."),
        ("training", TrainingConfig, "The main run."),
        ("evaluation", EvaluationConfig, "Main and reduced (probe) evaluations."),
        ("method", MethodConfig, "The mixture policy."),
        ("method.grid", GridConfig, "The solver's (lambda, eps) grid (paper appendix G)."),
        (
            "method.floors",
            FloorsConfig,
            "Least weights the solver keeps, as shares of batches (also under "
            "training.sampling: tokens).",
        ),
        (
            "datasets[]",
            DatasetConfig,
            "One entry per dataset; roles decide what is trained and evaluated.",
        ),
    ]
    lines = [
        "# Run configuration reference",
        "",
        *prose_lines(
            "Generated from the config's field descriptions (`dynamics.engine.config_docs`); "
            "a test keeps this file in sync. Override any field on the command line with "
            "`key.path=value` (datasets by name: `datasets.math.budget=500`). The config of one "
            "of the paper's scenarios, with the paper's settings: "
            "`dynamics scenarios config paper/s28`; train it with "
            "`dynamics run --scenario paper/s28` (docs/datasets.md says how its datasets are read)."
        ),
        "",
        "| field | default | description |",
        "| --- | --- | --- |",
    ]
    for field_name in ("output_dir", "trackers", "tracker_project", "tracker_run_name"):
        info = RunConfig.model_fields[field_name]
        lines.append(f"| `{field_name}` | `{_default(info)}` | {info.description} |")
    for prefix, model, intro in sections:
        lines += [
            "",
            f"## `{prefix}`",
            "",
            *prose_lines(intro),
            "",
            "| field | default | description |",
            "| --- | --- | --- |",
        ]
        for name, info in model.model_fields.items():
            lines.append(f"| `{name}` | `{_default(info)}` | {info.description or ''} |")
    return "\n".join(lines) + "\n"


def prose_lines(text: str) -> list[str]:
    """A paragraph as lines within the docs' width. A code span stays on one line, so that it
    can be copied as it is; a table row keeps its field's description on one line, as a
    Markdown table needs."""
    lines: list[str] = []
    for word in _WORD.findall(text):
        if lines and len(lines[-1]) + 1 + len(word) <= PROSE_WIDTH:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def _default(info: Any) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()
        return "{...}" if isinstance(value, BaseModel) else repr(value)
    return repr(info.default)
