"""The before/after table of ``lm_eval.json`` (``dynamics eval``): one line per task and
metric, the base model's value and the best checkpoint's, each with lm-eval's own stderr."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dynamics.engine.harness import LM_EVAL_FILE


def read_lm_eval(run_dir: str | Path) -> dict[str, Any] | None:
    """``RUN_DIR/lm_eval.json``, or None when the run has not been evaluated."""
    path = Path(run_dir) / LM_EVAL_FILE
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _value(results: dict[str, Any], key: str) -> str:
    value = results.get(key)
    if not isinstance(value, int | float):
        return "-"
    name, _, filter_name = key.partition(",")
    stderr = results.get(f"{name}_stderr,{filter_name}")
    return f"{value:.4f} ± {stderr:.4f}" if isinstance(stderr, int | float) else f"{value:.4f}"


def lm_eval_table(record: dict[str, Any]) -> list[str]:
    """Lines of the table: task, metric, base, best checkpoint, change."""
    models = record["models"]
    base, best = models["base"]["results"], models["best_checkpoint"]["results"]
    limit = "" if record.get("limit") is None else f", limit {record['limit']}"
    header = ["task", "metric", "base", "best checkpoint", "change"]
    rows = []
    for task in sorted(set(base) | set(best)):
        before, after = base.get(task, {}), best.get(task, {})
        keys = [k for k in {**before, **after} if "," in k and "_stderr," not in k]
        for key in keys:
            old, new = before.get(key), after.get(key)
            change = (
                f"{new - old:+.4f}"
                if isinstance(old, int | float) and isinstance(new, int | float)
                else "-"
            )
            rows.append(
                [task, key.replace(",none", ""), _value(before, key), _value(after, key), change]
            )
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"lm-evaluation-harness {record.get('lm_eval_version', '')} (value ± stderr{limit}):"]
    for row in [header, *rows]:
        lines.append(
            "  ".join(
                str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)
            ).rstrip()
        )
    return lines
