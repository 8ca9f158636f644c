"""The lm-evaluation-harness part of a model card: the run's ``lm_eval.json`` (written by
``dynamics eval``) as the Hub's evaluation results (the metadata's ``model-index``) and as
the card's table of the base model's and the best checkpoint's values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult

from dynamics.runs.rundir import LM_EVAL_FILE, RunDirError


def lm_eval_record(folder: Path) -> dict[str, Any] | None:
    """The run's ``lm_eval.json`` (``dynamics eval``), or None when it has not been evaluated."""
    path = folder / LM_EVAL_FILE
    if not path.is_file():
        return None
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise RunDirError(
            f"{path} cannot be read ({err}): run dynamics eval again, or remove it"
        ) from None
    return record


def metric_keys(results: dict[str, Any]) -> list[str]:
    """lm-eval's ``metric,filter`` keys of one task's results, its stderr keys left out."""
    return [k for k in results if "," in k and "_stderr," not in k]


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def eval_results(record: dict[str, Any]) -> list[EvalResult]:
    """The best checkpoint's lm-evaluation-harness results of ``lm_eval.json`` as the Hub's
    evaluation results (its ``model-index``): one per task and metric with a value."""
    best = record["models"]["best_checkpoint"]
    shots = best.get("n-shot") or {}
    found = []
    for task, results in sorted(best["results"].items()):
        for key in metric_keys(results):
            if not is_number(results[key]):
                continue
            metric, _, filter_name = key.partition(",")
            found.append(
                EvalResult(
                    task_type="text-generation",
                    dataset_type=task,
                    dataset_name=str(results.get("alias") or task).strip(" -"),
                    dataset_args={"num_few_shot": shots[task]}
                    if is_number(shots.get(task))
                    else None,
                    metric_type=metric,
                    metric_name=metric if filter_name == "none" else f"{metric} ({filter_name})",
                    metric_value=results[key],
                )
            )
    return found


def lm_eval_section(record: dict[str, Any]) -> list[str]:
    """The lm-evaluation-harness results of ``lm_eval.json``: the base model's and this one's."""
    models = record["models"]
    base, best = models["base"]["results"], models["best_checkpoint"]["results"]
    limit = record.get("limit")
    if limit is None:
        scope = "every document of each task"
    elif limit < 1:  # lm-eval's --limit below 1 is a fraction of each task's documents
        scope = f"the first {limit:.0%} of each task's documents"
    else:
        scope = f"at most {int(limit)} documents per task"
    lines = [
        "## lm-evaluation-harness",
        "",
        f"lm-evaluation-harness {record.get('lm_eval_version', '')} on {scope} (`dynamics eval`; "
        f"the "
        "metadata's model-index holds this model's values).",
        "",
        "| task | metric | base model | this model |",
        "| --- | --- | --- | --- |",
    ]
    for task in sorted(set(base) | set(best)):
        before, after = base.get(task, {}), best.get(task, {})
        for key in metric_keys({**before, **after}):
            shown = [f"{v:.4f}" if is_number(v) else "-" for v in (before.get(key), after.get(key))]
            lines.append(f"| {task} | {key.replace(',none', '')} | {shown[0]} | {shown[1]} |")
    return lines
